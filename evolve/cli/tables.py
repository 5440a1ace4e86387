"""Rendering of results: rich tables for people (metric rows, experiments, a search's summary),
NaN-free JSON for scripts."""

from __future__ import annotations

import dataclasses
import json
import math

from rich.table import Table

from stepml_evolve.evaluator.datasets import ExperimentSummary
from stepml_evolve.evaluator.numbers import finite, fmt
from stepml_evolve.evaluator.scoring.metrics import MetricRow

from .console import plain


def clean(obj):
    """JSON-safe copy: NaN and infinities become null; metric rows in their documented shape."""
    if isinstance(obj, MetricRow):
        return clean(obj.to_json())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return clean(dataclasses.asdict(obj))
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def dumps(obj) -> str:
    return json.dumps(clean(obj), indent=2)


def metrics_table(rows: list[MetricRow], title: str) -> Table:
    t = Table(title=plain(title))
    for col in (
        "experiment",
        "n",
        "E2E obs s",
        "E2E pred s",
        "E2E APE%",
        "TTFT obs s",
        "TTFT pred s",
        "TTFT APE%",
        "ITL obs ms",
        "ITL pred ms",
        "ITL APE%",
        "timeouts obs/pred",
    ):
        t.add_column(col, justify="left" if col == "experiment" else "right")
    for r in rows:
        o, p, a = r.observed, r.predicted, r.ape
        t.add_row(
            plain(r.name),
            str(r.n_requests),
            fmt(o.e2e_mean_s, ".3f"),
            fmt(p.e2e_mean_s, ".3f"),
            fmt(a.e2e, ".1f"),
            fmt(o.ttft_mean_s, ".4f"),
            fmt(p.ttft_mean_s, ".4f"),
            fmt(a.ttft, ".1f"),
            fmt(o.itl_mean_ms, ".2f"),
            fmt(p.itl_mean_ms, ".2f"),
            fmt(a.itl, ".1f"),
            f"{r.timeouts.observed}/{r.timeouts.predicted}",
        )
    return t


def identifiability_table(reports, title: str) -> Table:
    """Each fitted constant: its value, its prior, how far it strayed (z), the profile's curvature
    of the data's loss against the prior's, and whether the data decided it."""
    t = Table(title=plain(title))
    for col in ("constant", "value", "prior", "z", "data curv.", "prior curv.", "decided by", "why"):
        t.add_column(col, justify="left" if col in ("constant", "prior", "decided by", "why") else "right")
    for r in reports:
        t.add_row(
            plain(r.name),
            f"{r.value:.4g}",
            plain(r.prior.text()) if r.prior else "none",
            "" if r.z is None else f"{r.z:+.2f}",
            f"{r.data_curvature:.3g}",
            f"{r.prior_curvature:.3g}",
            r.verdict,
            plain(r.why),
        )
    return t


def floor_text(check) -> str:
    """One line on a program against the physical floor."""
    if not check.ok:
        return f"floor: BELOW: {check.reason()}"
    return (
        f"floor: at least {check.ratio:.3g}x the physical floor everywhere in the envelope (closest at {check.worst})"
    )


def cv_summary_table(summary: dict[str, dict[str, float]], title: str) -> Table:
    """Mean, median and max APE (%) per metric over the held-out experiments of a cross-validation."""
    t = Table(title=title)
    for col in ("APE %", "mean", "median", "max"):
        t.add_column(col, justify="left" if col == "APE %" else "right")
    for metric, stats in summary.items():
        t.add_row(metric.upper(), *(fmt(stats[k], ".1f", keep_inf=True) for k in ("mean", "median", "max")))
    return t


def loss_text(x: float) -> str:
    """A loss for people; NaN means no experiment could be scored."""
    return fmt(x, ".3f", missing="n/a (no experiment has a successful request in this split)", keep_inf=True)


def prompts_cell(reuse: dict | None) -> str:
    """What the loader decided about shared prompts, in a few words: `cycle 100 (99.1%)`, `system 11`, ..."""
    if not reuse:
        return ""
    if reuse["model"] == "cycle":
        return f"cycle {reuse['period']} ({reuse['share_matched'] * 100:.1f}%)"
    return {"recorded": f"recorded {reuse['n_prompts']}", "system-prompt": f"system {reuse['n_prompts']}"}.get(
        reuse["model"], "none"
    )


def experiments_table(rows: list[ExperimentSummary], title: str) -> Table:
    t = Table(
        title=plain(title),
        caption="measured at: client = TTFT/E2E from the client's send time, server = from the "
        "server's arrival (span start); the replay's arrival is that moment. prompts: how "
        "requests share prompt blocks (cycle P (share): a list of P prompts sent in turn, "
        "share of requests matching it; system G: G system prompts; recorded G: groups in "
        "the data); cached %: prompt tokens a never-evicting prefix cache would serve",
    )
    for col in (
        "experiment",
        "model",
        "TP",
        "kind",
        "requests",
        "failed",
        "out len",
        "measured at",
        "prompts",
        "cached %",
        "E2E s",
        "TTFT s",
        "train/val/test",
    ):
        t.add_column(col, justify="left" if col in ("experiment", "model") else "right")
    for r in rows:
        s = r.split
        cached = fmt(r.prompt_reuse["cached_share"] * 100, ".1f") if r.prompt_reuse else ""
        t.add_row(
            plain(r.name),
            plain(r.model.split("/")[-1]),
            str(r.tp),
            "MoE" if r.moe else "dense",
            str(r.n_requests),
            str(r.n_failed),
            str(r.output_len),
            r.measurement,
            prompts_cell(r.prompt_reuse),
            cached,
            fmt(r.observed["e2e_mean_s"], ".3f"),
            fmt(r.observed["ttft_mean_s"], ".4f"),
            f"{s['train']}/{s['validate']}/{s['test']}",
        )
    return t


def _refit(program: dict) -> str:
    """ ", a refit of #N": the program is an older one's structure with other constants."""
    return f", a refit of #{program['refit_of']}" if program.get("refit_of") else ""


def run_summary_tables(summary: dict) -> list:
    """What `evolve run` prints at its end: the best program, its test errors, the Pareto front."""
    best = summary.get("best")
    if not best:
        return ["no program was fully evaluated"]
    headline = (
        f"best program by validation loss: #{best['id']} (generation {best['generation']}, {best['operator']}{_refit(best)}), "
        f"val loss {fmt(best['val_loss'], '.3f')}, test loss {fmt(best['test_loss'], '.3f')}, complexity {best['complexity']}"
    )
    t = Table(title=f"program #{best['id']}: test split, absolute % error of means")
    for col in ("experiment", "n", "E2E", "TTFT", "ITL"):
        t.add_column(col, justify="left" if col == "experiment" else "right")
    for r in best["test"]:
        t.add_row(r["name"], str(r["n_requests"]), *(fmt(r["ape"][k], ".1f") for k in ("e2e", "ttft", "itl")))
    f = Table(title="Pareto front (validation loss vs complexity)")
    protocols = sorted({k for p in summary["front"] for k in (p.get("cv") or {})})
    for col in ("id", "complexity", "val loss", *(f"CV loss {k}" for k in protocols), "operator"):
        f.add_column(col)
    for p in summary["front"]:
        cv = [fmt((p.get("cv") or {}).get(k), ".3f", keep_inf=True) for k in protocols]
        f.add_row(str(p["id"]), str(p["complexity"]), f"{p['val_loss']:.3f}", *cv, p["operator"])
    deployed = summary.get("deployed")
    deploy = (
        [
            f"deployed by `evolve emit-go` (rule {deployed['rule']}): #{deployed['id']}{_refit(deployed)}; {deployed['why']}",
            *([f"deployed with {deployed['pinned']['why']}"] if deployed.get("pinned") else []),
        ]
        if deployed
        else []
    )
    return [headline, *_baseline_lines(summary), t, f, *deploy]


def _baseline_lines(summary: dict) -> list[str]:
    """Each baseline's losses beside the best program's (mean E2E error over the test experiments)."""
    tests = [e for r in summary["best"]["test"] if finite(e := r["ape"]["e2e"])]
    mine = fmt(sum(tests) / len(tests), ".1f") if tests else "n/a"
    return [
        f"baseline {b['name']} (never searched from): val loss {fmt(b['val_loss'], '.3f')}, test loss "
        f"{fmt(b['test_loss'], '.3f')}, test mean E2E error {fmt(b['test_e2e_ape'], '.1f')} % (the best program: {mine} %)"
        for b in summary.get("baselines") or []
    ]


def blis_comparison_table(rows) -> Table:
    """blis-compare: per experiment, requests compared, mean E2E/TTFT in the tool and BLIS, exact shares, seconds."""
    t = Table(title="the program in BLIS vs in the tool (BLIS semantics), requests that succeeded in reality")
    for col in (
        "experiment",
        "n",
        "E2E tool ms",
        "E2E BLIS ms",
        "diff %",
        "TTFT tool ms",
        "TTFT BLIS ms",
        "diff %",
        "exact E2E %",
        "exact TTFT %",
        "BLIS s",
        "tool s",
        "trace gap E2E %",
        "trace gap TTFT %",
    ):
        t.add_column(col, justify="left" if col == "experiment" else "right")
    for f in rows:
        t.add_row(
            f.experiment,
            str(f.n_compared),
            f"{f.e2e_mean_ms[0]:.3f}",
            f"{f.e2e_mean_ms[1]:.3f}",
            f"{f.e2e_diff_pct:+.3f}",
            f"{f.ttft_mean_ms[0]:.3f}",
            f"{f.ttft_mean_ms[1]:.3f}",
            f"{f.ttft_diff_pct:+.3f}",
            f"{f.exact_e2e * 100:.1f}",
            f"{f.exact_ttft * 100:.1f}",
            f"{f.blis_s:.1f}",
            f"{f.tool_s:.3f}",
            f"{f.workload_gap_pct[1]:+.3f}",
            f"{f.workload_gap_pct[0]:+.3f}",
        )
    t.caption = (
        "trace gap: the tool's own means on the prompts as the trace states them, against the full workload "
        "model (a trace cannot say that two prompts share a system prompt)"
    )
    return t


def cluster_bench_table(figures: dict) -> Table:
    """bench --cluster: replays/s and generations/hour on threads and per count of Ray workers."""
    t = Table(
        title=f"{figures['data']}, {figures['batch']} per batch; cluster {figures['cluster']} "
        f"({figures['cluster_cpus']} CPUs, connected in {figures['connect_s']} s)"
    )
    for col in ("where", "workers", "replays/s", "x threads", "generations/h", "x threads", "same losses"):
        t.add_column(col, justify="left" if col == "where" else "right")
    for r in figures["rows"]:
        t.add_row(
            r["where"],
            str(r["workers"]),
            f"{r['replays_per_s']:.1f}",
            fmt(r.get("replays_vs_threads"), ".2f", missing=""),
            fmt(r.get("generations_per_hour")),
            fmt(r.get("generations_vs_threads"), ".2f", missing=""),
            "" if "identical" not in r else ("yes" if r["identical"] else "NO"),
        )
    return t


def worlds_table(worlds) -> Table:
    t = Table(title="known-truth worlds (evolve data synth --world NAME --out DIR)")
    for col in ("world", "constants", "physics"):
        t.add_column(col, justify="right" if col == "constants" else "left")
    for w in worlds:
        t.add_row(plain(w.name), str(len(w.program.constants)), plain(w.summary))
    return t


def worlds_bench_table(results, summary: dict) -> Table:
    """`evolve bench --worlds`: held-out loss (E2E / TTFT APE %) of the best seed, the search's winner, the
    law and the baselines."""
    t = Table(
        title="known-truth worlds: held-out loss (mean E2E / TTFT APE %)",
        caption="with several fits a program (--held-out-fits): the picked fit (--held-out-pick), \\[the range of "
        "the fits' held-out losses]. "
        f"recovered: the winner within 1.5x of the law's held-out loss. train: the winner's train loss over the "
        "law's; unidentified: not recovered, but the winner fits the train configurations within 1.1x of the law "
        "or better, so they cannot tell the two apart; not found: it fits them worse. The winner beats the best "
        f"seed on {summary['beats_seed']} of {summary['of']} worlds and recovers the law on {summary['recovered']} "
        "(per world: mean over its splits; recovered on every split)",
    )
    for col in (
        "world",
        "split",
        "search seed",
        "held out",
        "best seed",
        "seed",
        "winner",
        "made by",
        "law",
        "beats seed",
        "recovered",
        "train",
        "diagnosis",
    ):
        t.add_column(col, justify="left" if col in ("world", "split", "best seed", "made by") else "right")
    diagnosed = any(r.archive_best is not None for r in results)
    if diagnosed:  # --archive-top
        t.add_column("best in archive", justify="right")
    baselines = sorted({b.program for r in results for b in r.baselines})  # BLIS's blackbox, beside the seeds
    for name in baselines:
        t.add_column(f"baseline {plain(name)}", justify="right")

    def cell(s) -> str:  # with several fits: the picked fit's, and the range of their held-out losses
        spread = f" [{fmt(min(s.losses), '.2f')}-{fmt(max(s.losses), '.2f')}]" if s.losses else ""
        return f"{fmt(s.loss, '.2f')} ({fmt(s.e2e_ape, '.1f')} / {fmt(s.ttft_ape, '.1f')}){spread}"

    for r in results:
        best = r.best_seed
        t.add_row(
            plain(r.world),
            r.split,
            "" if r.search_seed is None else str(r.search_seed),
            str(r.held_out),
            plain(best.program),
            cell(best),
            cell(r.winner),
            plain(r.winner_origin),
            cell(r.law),
            "yes" if r.beats_seed else "no",
            "yes" if r.recovered else "no",
            f"{fmt(r.train_ratio, '.2f')}x" if math.isfinite(r.train_ratio) else "",
            r.diagnosis or "",
            *([archive_cell(r)] if diagnosed else []),
            *(cell(by[n]) if n in (by := {b.program: b for b in r.baselines}) else "" for n in baselines),
        )
    return t


def worlds_rules_table(summary: dict) -> Table:
    """`evolve bench --worlds`: each deployment rule's pick held out against the best fitted seed, over every cell."""
    t = Table(
        title=f"deployment rules over {summary['cells']} world-split-seed cells: the pick held out against the best seed",
        caption="geomean: the geometric mean over cells of the pick's held-out loss over the best seed's (< 1: better)",
    )
    for col in ("rule", "beats seed", "worse than seed", "recovered", "geomean"):
        t.add_column(col, justify="left" if col == "rule" else "right")
    for rule, c in summary.get("rules", {}).items():
        g = c.get("geomean_to_seed")
        t.add_row(
            rule,
            f"{c['beats_seed']}/{c['cells']}",
            f"{c['worse_than_seed']}/{c['cells']}",
            f"{c['recovered']}/{c['cells']}",
            "" if g is None else f"{g:.3f}",
        )
    return t


def archive_cell(r) -> str:
    """--archive-top: the best held out of the programs scored, and whether it is within 1.5x of the law."""
    if r.archive_best is None:
        return ""
    recovers = ", recovers" if r.archive_recovers else ""
    return f"{plain(r.archive_best.program)} {fmt(r.archive_best.loss, '.2f')} of {r.archive_scored}{recovers}"


def associations_table(associations, title: str, top: int = 10) -> Table:
    """`evolve explain`: the strongest associations of a program's error, with their bins."""
    t = Table(title=plain(title))
    for col in ("latency", "by", "strength", "error % in each quartile (level)"):
        t.add_column(col, justify="right" if col == "strength" else "left")
    for a in associations[:top]:
        strength = f"rho {a.strength:+.2f}" if a.kind == "rank" else f"eta2 {a.strength:.2f}"
        bins = ", ".join(f"{plain(label)}: {err:+.1f}" for label, err, _ in a.bins)
        t.add_row(a.latency, plain(a.feature), strength, bins)
    return t


def screening_table(screening, title: str, top: int = 10) -> Table:
    """`evolve explain`: the best screened terms, their coefficient and the most the tether allows
    it (blank: unbounded), their gain, chance and held-out gains."""
    t = Table(title=plain(title))
    for col in ("term", "family", "k", "k max", "gain %", "chance %", "held out %", "passed"):
        t.add_column(col, justify="left" if col in ("term", "family", "held out %") else "right")
    for s in screening.results[:top]:
        held = ", ".join(f"{g} {v * 100:+.1f}" for g, v in s.held_out.items())
        t.add_row(
            plain(s.term.shown()),
            s.term.family,
            fmt(s.coefficient, 4),
            fmt(s.cap, 4) if s.cap < float("inf") else "",
            fmt(s.gain * 100, ".1f"),
            fmt(s.chance * 100, ".1f"),
            held or "n/a",
            "yes" if s.passed else "no",
        )
    return t
