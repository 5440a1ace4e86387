"""`evolve archive ...`: browse a search archive (list, show, pareto, diff, history), write the HTML report,
cross-validate programs and store their scores (cv), and upgrade an older archive (migrate).

Thin wiring: each command calls one query of evolve.browse (or a backend of evolve.commands)
and prints the result, rich tables for people and JSON with --json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from stepml_evolve.evaluator.choices import DEFAULT_PROTOCOL, DEFAULT_SEMANTICS, PROTOCOLS
from stepml_evolve.evaluator.fit.config import FitConfig
from stepml_evolve.evaluator.numbers import fmt
from stepml_evolve.evolve.browse.choices import SORT_KEYS

from .console import CommandGroup, out, say
from .options import WorkersOption
from .progress import fit_progress

archive_app = typer.Typer(
    cls=CommandGroup,
    no_args_is_help=True,
    help="Browse a search archive: programs, lineage, Pareto front, diffs, HTML report; cross-validate its programs.",
)

ArchiveOpt = typer.Option(
    None, "--archive", help="Archive directory (default: the most recently written one under ./runs)."
)
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of tables.")
RunDataOpt = typer.Option(
    None,
    "--data",
    help="Where the run's experiments are (default: the directory the run recorded; they must be the same experiments).",
)
SortKey = Literal[SORT_KEYS]
Protocol = Literal[PROTOCOLS]


def _cv_loss(r: dict, protocol: str) -> str:
    """A row's CV loss of `protocol`, blank where it has none."""
    score = r["cv"].get(protocol)
    return fmt(score["loss"], keep_inf=True) if score else ""


def _programs_table(rows: list[dict], title: str) -> Table:
    """Program rows; one CV column per protocol some row has a score of (one blank `cv` column if none has)."""
    from stepml_evolve.archive.access import protocol_order

    protocols = protocol_order(proto for r in rows for proto in r["cv"])
    t = Table(title=title)
    cv_cols = [f"cv {p}" for p in protocols] or ["cv"]
    for col in (
        "id",
        "gen",
        "operator",
        "train",
        "val",
        "test",
        "quick",
        *cv_cols,
        "complexity",
        "cell",
        "stage",
        "components",
    ):
        t.add_column(col, justify="left" if col in ("operator", "stage", "components") else "right")
    for r in rows:
        cv = [_cv_loss(r, p) for p in protocols] or [""]
        t.add_row(
            f"{r['id']}{'*' if r['front'] else ''}",
            str(r["generation"]),
            escape(r["operator"] + (f" (refit #{r['refit_of']})" if r.get("refit_of") else "")),
            fmt(r["train_loss"]),
            fmt(r["val_loss"]),
            fmt(r["test_loss"]),
            fmt(r["quick_loss"]),
            *cv,
            str(r["complexity"]),
            f"{r['cell'][0]},{r['cell'][1]}",
            r["stage"],
            escape(" ".join(r["components"])),
        )
    return t


def _print_rows(rows: list[dict], title: str, as_json: bool) -> None:
    """Program rows as JSON (for scripts) or as a table."""
    from .tables import dumps

    if as_json:
        print(dumps([{k: v for k, v in r.items() if k != "front"} for r in rows]))
    else:
        out.print(_programs_table(rows, title))


@archive_app.command("list")
def list_cmd(
    archive_dir: Path | None = ArchiveOpt,
    sort: SortKey = typer.Option(
        "val",
        "--sort",
        help="Sort key (cv: the CV loss of the protocol most programs have, ties lomo, else lowo; programs without that score follow by validation loss).",
    ),
    front: bool = typer.Option(False, "--front", help="Only Pareto-front members."),
    cell: str | None = typer.Option(
        None, "--cell", help="Only programs in MAP-Elites cell C,N (complexity bin, components)."
    ),
    operator: str | None = typer.Option(None, "--operator", help="Only programs whose operator contains this text."),
    include_screened: bool = typer.Option(False, "--all", help="Include screened-only programs (quick loss only)."),
    as_json: bool = JsonOpt,
):
    """Programs of the archive: operator, losses, complexity, components (* marks the Pareto front)."""
    from stepml_evolve.evolve.browse.listing import list_programs

    listing = list_programs(
        archive_dir, sort=sort, front_only=front, cell=cell, operator=operator, include_screened=include_screened
    )
    _print_rows(listing.rows, f"{len(listing.rows)} programs in {listing.archive_dir} (sorted by {sort})", as_json)


@archive_app.command("show")
def show_cmd(
    program_id: str = typer.Argument(..., metavar="ID", help="Program id, or 'best' (lowest validation loss)."),
    archive_dir: Path | None = ArchiveOpt,
    as_json: bool = JsonOpt,
    source_only: bool = typer.Option(
        False,
        "--source",
        help="Print only the fitted program, as a file for evolve fit / eval / emit-go or run --seed-programs.",
    ),
    deployed: bool = typer.Option(
        False,
        "--deployed",
        help="With --source: the constants the run's end pinned to the program's seed's, as emit-go deploys it.",
    ),
):
    """A program: source, fitted constants, descriptors, lineage to a seed, per-experiment errors by split."""
    from rich.syntax import Syntax

    from stepml_evolve.evolve.browse.listing import show_program, show_source

    from .tables import dumps, metrics_table

    if source_only:
        print(show_source(archive_dir, program_id, deployed), end="")
        return
    detail = show_program(archive_dir, program_id)
    if as_json:
        print(dumps(detail))
        return
    p = detail["program"]
    out.print(
        f"[bold]program #{p['id']}[/bold]  generation {p['generation']}, {escape(p['operator'])}: "
        f"{escape(p['operator_detail'])}",
        highlight=False,
    )
    out.print(
        f"stage {p['stage']}; train loss {fmt(p['train_loss'])}, val {fmt(p['val_loss'])}, test {fmt(p['test_loss'])}, "
        f"quick {fmt(p['quick_loss'])}; complexity {p['complexity']}, {p['n_components']} components "
        f"({escape(' '.join(p['components']))}); cell {p['cell'][0]},{p['cell'][1]} ({p['cell_label']})"
        f"{'; on the Pareto front' if p['front'] else ''}",
        highlight=False,
    )
    out.print(Syntax(p["source"], "python", theme="ansi_dark", word_wrap=True))
    consts = Table(title="fitted constants")
    consts.add_column("constant")
    consts.add_column("value", justify="right")
    pins = p.get("pins")
    if pins:
        consts.add_column("deployed", justify="right")
    for name, value in p["constants"].items():
        deployed = [f"{pins['constants'][name]:.6g}" + (" (pinned)" if name in pins["pinned"] else "")] if pins else []
        consts.add_row(escape(name), f"{value:.6g}", *deployed)
    out.print(consts)
    if pins:
        from stepml_evolve.evolve.deploy.pins import pins_text

        out.print(f"deployed with {escape(pins_text(pins))}", highlight=False)
    out.print(_lineage_table(detail["lineage"]))
    for split, rows in detail["evaluations"].items():
        out.print(metrics_table(rows, f"program #{p['id']}, {split} split"))
    if not detail["evaluations"]:
        out.print(f"no per-experiment evaluations stored (stage {p['stage']}: screened programs get only a quick fit)")
    _print_cv(p, detail["cv_evaluations"])


def _print_cv(p: dict, held_out: dict[str, list[dict]]) -> None:
    from .tables import cv_summary_table

    if not p["cv"]:
        out.print(f"no CV score (evolve archive cv {p['id']} cross-validates it)", highlight=False)
    for protocol, score in p["cv"].items():
        out.print(
            f"CV loss ({protocol}): {fmt(score['loss'], '.3f', keep_inf=True)}  ({score['folds']} folds, fit seed "
            f"{score['seed']}, max-evals {score['max_evals'] or 'default'}, {score['method']}, {score['objective']})",
            highlight=False,
        )
        rows = held_out.get(protocol) or []
        if rows:
            out.print(_held_out_table(rows, f"program #{p['id']}, {protocol}: held-out experiments, all requests"))
        out.print(
            cv_summary_table(
                {m: score[m] for m in ("e2e", "ttft", "itl")},
                f"program #{p['id']}, {protocol}: APE % over the held-out experiments",
            )
        )


def _held_out_table(rows: list[dict], title: str) -> Table:
    t = Table(title=title)
    for col in (
        "fold",
        "experiment",
        "n",
        "E2E obs s",
        "E2E pred s",
        "E2E APE%",
        "TTFT obs s",
        "TTFT pred s",
        "TTFT APE%",
    ):
        t.add_column(col, justify="left" if col in ("fold", "experiment") else "right")
    for r in rows:
        o, pr, a = r["observed"], r["predicted"], r["ape"]
        t.add_row(
            escape(r["fold"]),
            escape(r["name"]),
            str(r["n_requests"]),
            fmt(o["e2e_mean_s"], ".3f"),
            fmt(pr["e2e_mean_s"], ".3f"),
            fmt(a["e2e"], ".1f"),
            fmt(o["ttft_mean_s"], ".4f"),
            fmt(pr["ttft_mean_s"], ".4f"),
            fmt(a["ttft"], ".1f"),
        )
    return t


def _lineage_table(steps: list[dict]) -> Table:
    t = Table(title="lineage (first parent back to a seed)")
    for col in ("id", "gen", "operator", "detail", "other parent", "val", "complexity"):
        t.add_column(col, justify="left" if col in ("operator", "detail") else "right")
    for s in steps:
        t.add_row(
            str(s["id"]),
            str(s["generation"]),
            escape(s["operator"]),
            escape(s["operator_detail"]),
            ", ".join(str(q) for q in s["other_parents"]) or "-",
            fmt(s["val_loss"]),
            str(s["complexity"]),
        )
    return t


@archive_app.command("pareto")
def pareto_cmd(archive_dir: Path | None = ArchiveOpt, as_json: bool = JsonOpt):
    """The Pareto front: validation loss vs complexity, by increasing complexity."""
    from stepml_evolve.evolve.browse.listing import front_programs

    listing = front_programs(archive_dir)
    _print_rows(listing.rows, f"Pareto front of {listing.archive_dir} (validation loss vs complexity)", as_json)


@archive_app.command("history")
def history_cmd(
    archive_dir: Path | None = ArchiveOpt,
    every: int | None = typer.Option(
        None, "--every", help="A row every N generations, besides each that improved the best (default: ~25 rows)."
    ),
    as_json: bool = JsonOpt,
):
    """The run by generation: its pace, and the best losses with the programs that set them."""
    from stepml_evolve.evolve.browse.listing import run_history

    from .tables import dumps

    h = run_history(archive_dir, every)
    if as_json:
        print(dumps(h))
        return
    val = "best val" if h["cv"] == "none" else f"best cv {h['cv']}"
    t = Table(title=f"{h['archive']}: generations 0..{h['generations']}")
    for col in ("gen", "elapsed", "seconds", "promoted", "evals", val, "its train", "new best"):
        t.add_column(col, justify="right")
    for r in h["rows"]:
        t.add_row(
            str(r["generation"]),
            _clock(r["elapsed_s"]),
            f"{r['seconds']:.1f}",
            str(r["promoted"]),
            str(r["evaluations"]),
            Text(fmt(r["best_val"], ".3f"), style="bold" if r["improved"] else ""),
            fmt(r["best_train"], ".3f"),
            f"#{r['new_best']}" if r["new_best"] is not None else "",
        )
    out.print(t)
    pace = (
        f"; generation 0 {h['generation0_s']:.1f} s, then {h['mean_s']:.1f} s a generation ({h['per_hour']:.0f} an hour)"
        if h["mean_s"] is not None
        else ""
    )
    out.print(
        f"{h['generations'] + 1} generations in {_clock(h['wall_s'])}{pace}; {h['evaluations']} closed-loop evaluations"
    )


def _clock(seconds: float) -> str:
    """h:mm:ss"""
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@archive_app.command("diff")
def diff_cmd(
    a: str = typer.Argument(..., metavar="A", help="Program id or 'best'."),
    b: str = typer.Argument(..., metavar="B", help="Program id or 'best'."),
    archive_dir: Path | None = ArchiveOpt,
    as_json: bool = JsonOpt,
):
    """Unified diff of two programs' sources and how their losses and per-experiment errors change (B - A)."""
    from stepml_evolve.evolve.browse.listing import compare_programs

    from .tables import dumps

    result = compare_programs(archive_dir, a, b)
    if as_json:
        print(dumps(result))
        return
    styles = {"+": "green", "-": "red", "@": "cyan"}
    for line in result["source_diff"] or ["(identical sources)"]:
        out.print(Text(line, style=styles.get(line[:1], "")), soft_wrap=True)
    ida, idb = result["a"]["id"], result["b"]["id"]
    t = Table(title=f"metrics, #{ida} -> #{idb}")
    for col in ("metric", f"#{ida}", f"#{idb}", "change"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for name, c in result["metrics"].items():
        t.add_row(name, fmt(c["a"]), fmt(c["b"]), fmt(c["delta"], "+.3g"))
    out.print(t)
    e = Table(title="validate split, APE % of mean E2E and TTFT")
    for col in ("experiment", f"E2E #{ida}", f"E2E #{idb}", "change", f"TTFT #{ida}", f"TTFT #{idb}", "change"):
        e.add_column(col, justify="left" if col == "experiment" else "right")
    for r in result["validate_experiments"]:
        e2e, ttft = r["ape_e2e"], r["ape_ttft"]
        e.add_row(
            r["name"],
            fmt(e2e["a"]),
            fmt(e2e["b"]),
            fmt(e2e["delta"], "+.3g"),
            fmt(ttft["a"]),
            fmt(ttft["b"]),
            fmt(ttft["delta"], "+.3g"),
        )
    out.print(e)


@archive_app.command("report")
def report_cmd(
    out_path: Path = typer.Option(Path("report.html"), "--out", help="HTML file to write (one self-contained page)."),
    archive_dir: Path | None = ArchiveOpt,
):
    """Write one self-contained HTML page: run summary, plots (inline SVG), program table and sources."""
    from stepml_evolve.evolve.commands.report import write_report

    written_from = write_report(archive_dir, out_path)
    out.print(f"wrote {out_path} (archive {written_from})", highlight=False)


@archive_app.command("cv")
def archive_cv_cmd(
    program_ids: list[str] | None = typer.Argument(
        None, metavar="ID", help="Programs to cross-validate (ids or 'best'); default: the Pareto front."
    ),
    archive_dir: Path | None = ArchiveOpt,
    front: bool = typer.Option(False, "--front", help="The Pareto front (the default when no ID is given)."),
    protocol: Protocol = typer.Option(
        DEFAULT_PROTOCOL, "--protocol", help="lomo (leave one model out) or lowo (leave one workload out)."
    ),
    seed: int = typer.Option(
        FitConfig.seed, "--seed", min=0, help="Fold-fit seed: same seed and data give the same numbers."
    ),
    max_evals: int | None = typer.Option(
        FitConfig.max_evals,
        "--max-evals",
        min=1,
        help="Closed-loop evaluations per fold fit (default by method and size).",
    ),
    again: bool = typer.Option(
        False, "--again", help="Redo programs already scored under the protocol with these settings."
    ),
    data: Path | None = RunDataOpt,
    workers: WorkersOption = None,
    as_json: bool = JsonOpt,
):
    """Cross-validate programs with the run's data and fit settings and store the CV scores in the archive."""
    from stepml_evolve.evolve.commands.archive_cv import cross_validate_archive

    from .tables import dumps

    done = cross_validate_archive(
        archive_dir,
        program_ids,
        front=front,
        protocol=protocol,
        seed=seed,
        max_evals=max_evals,
        again=again,
        data=data,
        workers=workers,
        say=say,
        progress=fit_progress,
    )
    if as_json:
        print(dumps(done.to_json()))
        return
    c = done.fit.config
    semantics = f", {done.fit.semantics} semantics" if done.fit.semantics != DEFAULT_SEMANTICS else ""
    t = Table(
        title=f"{done.protocol} cross-validation, {done.archive_dir} (seed {c.seed}, max-evals {c.max_evals or 'default'}, "
        f"{c.method}, {c.objective.name}{semantics})"
    )
    for col in ("id", "complexity", "val loss", "CV loss", "E2E mean APE%", "TTFT mean APE%", ""):
        t.add_column(col, justify="left" if col == "" else "right")
    for r in done.programs:
        s = r.score
        t.add_row(
            str(r.program.id),
            str(r.program.complexity),
            fmt(r.program.val_loss),
            fmt(s.loss, keep_inf=True),
            fmt(s.e2e_mean, ".1f", keep_inf=True),
            fmt(s.ttft_mean, ".1f", keep_inf=True),
            "skipped: already scored" if r.skipped else f"scored in {s.seconds:.1f} s",
        )
    out.print(t)


@archive_app.command("pin")
def archive_pin_cmd(
    program_ids: list[str] = typer.Argument(..., metavar="ID", help="Children to pin (ids or 'best')."),
    archive_dir: Path | None = ArchiveOpt,
    data: Path | None = RunDataOpt,
    workers: WorkersOption = None,
    as_json: bool = JsonOpt,
):
    """Pin children's constants their training data cannot tell from their seed's to the seed's fit
    (as the run's end does to the child guarded deploys); emit-go and blis-compare deploy them."""
    from stepml_evolve.evolve.commands.archive_pin import pin_archive_programs
    from stepml_evolve.evolve.deploy.pins import pins_text

    from .tables import dumps

    directory, done = pin_archive_programs(archive_dir, program_ids, data=data, workers=workers, say=say)
    if as_json:
        print(dumps({"archive": str(directory), "programs": [d.to_json() for d in done]}))
        return
    for d in done:
        t = Table(title=f"#{d.program.id} against seed #{d.seed.id}: each shared constant put back alone")
        for col in ("constant", "fitted", "seed's", "train loss +", "deployed"):
            t.add_column(col, justify="left" if col == "constant" else "right")
        for name, cost in sorted(d.pins["costs"].items(), key=lambda kv: kv[1]):
            pinned = name in d.pins["pinned"]
            t.add_row(
                escape(name),
                f"{d.program.constants[name]:.6g}",
                f"{d.seed.constants[name]:.6g}",
                f"{cost:.4g}",
                "seed's (pinned)" if pinned else "fitted",
            )
        out.print(t)
        what = pins_text(d.pins) if d.pins["pinned"] else "nothing pinned: the data tell every shared constant apart"
        out.print(f"#{d.program.id}: {escape(what)}", highlight=False)


@archive_app.command("migrate")
def migrate_cmd(archive_dir: Path | None = ArchiveOpt):
    """Upgrade an archive of an older schema in place (browsing opens archives read-only, so it cannot)."""
    from stepml_evolve.archive.store import SCHEMA_VERSION
    from stepml_evolve.evolve.commands.archive_cv import migrate_archive

    directory, migrated_from = migrate_archive(archive_dir)
    if migrated_from is None:
        out.print(f"{directory}: already at the current schema; nothing to do", highlight=False)
    else:
        out.print(f"{directory}: migrated from schema {migrated_from} to {SCHEMA_VERSION}", highlight=False)
