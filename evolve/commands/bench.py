"""`evolve bench`: throughput figures on this machine (speed goals live here, not in tests)."""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import compile_program, load_program
from stepml_evolve.evaluator.errors import UserError, cut, shown
from stepml_evolve.evaluator.fit.fitting import METHODS, FitConfig, fit_constants, quick_config
from stepml_evolve.evaluator.readers import CONFIG_BYTES, read_json
from stepml_evolve.evaluator.replay.closed_loop import replay
from stepml_evolve.evaluator.say import Say
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.seeds import seed_path, seed_paths

BENCH_PROGRAM = "roofline"

# the figures `--reference` compares, in seconds (a ratio above 1: slower than the reference)
# but the --cv ratio, itself a ratio of seconds
REFERENCE_FIGURES = (
    "replay_s_largest",
    "full_eval_s",
    "quick_fit_s",
    "fit_s",
    "generation_0_s",
    "generation_s_mean",
    "cv_generation_ratio",
)


class BenchReferenceError(UserError):
    """A --reference file that is not an earlier `evolve bench --json` output."""


def read_reference(path: Path) -> dict:
    """An earlier `evolve bench --json` output, read under the one reader rule (a regular file of at
    most CONFIG_BYTES, JSON at most JSON_DEPTH deep, no integer past INT_DIGITS digits); each figure
    compared is null (a part the reference skipped) or a finite number of at least 0, and one is
    positive. BenchReferenceError naming the file (and the figure) otherwise."""
    figures = read_json(path, BenchReferenceError, "reference (an evolve bench --json output)", limit=CONFIG_BYTES)
    if not isinstance(figures, dict):
        raise BenchReferenceError(
            f"{path}: holds a JSON {type(figures).__name__}, not the object evolve bench --json writes"
        )
    for name in REFERENCE_FIGURES:
        value = figures.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise BenchReferenceError(
                f"{path}: figure {name} is {shown(value)}, not a finite number at least 0 (or null, a part it skipped)"
            )
    if not any(figures.get(k) for k in REFERENCE_FIGURES):
        raise BenchReferenceError(
            f"{path}: no figure of evolve bench --json in it (one of {', '.join(REFERENCE_FIGURES)}, above 0)"
        )
    return figures


def against_reference(figures: dict, reference: dict) -> dict:
    """Each timing figure measured now and in the reference: both values and now / reference
    (figures either run skipped are left out)."""
    out = {}
    for name in REFERENCE_FIGURES:
        now, then = figures.get(name), reference.get(name)
        if isinstance(now, (int, float)) and isinstance(then, (int, float)) and then > 0:
            out[name] = {"value": now, "reference": then, "ratio": round(now / then, 3)}
    return out


def default_bench_data() -> Path | None:
    for cand in (
        os.environ.get("STEPML_REAL_DATA"),
        "../shared/data/replay",
        Path(__file__).resolve().parents[3] / "shared/data/replay",
    ):
        if cand and Path(cand).is_dir():
            return Path(cand)
    return None


def _median_time(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed_search(loaded, pool: ReplayPool, generations: int, say: Say, **settings) -> dict:
    """A search with the default settings but `settings`, seed 0, timed: generation 0 (the seed
    fits) and the mean of generations 1..N (the front's CV at the end is not run)."""
    import tempfile

    from stepml_evolve.archive.records import generation_pace
    from stepml_evolve.archive.store import Archive
    from stepml_evolve.evolve.search import Search, SearchConfig

    config = SearchConfig(generations=generations, seed=0, front_cv="none", **settings)
    label = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in settings.items()) or "default settings"
    with tempfile.TemporaryDirectory(prefix="stepml-bench-") as tmp:
        archive = Archive(tmp, create=True)
        try:
            search = Search(
                archive,
                loaded,
                pool,
                config,
                progress=lambda info: (
                    say(f"  bench search ({label}): generation {info['generation']} done")
                    if "message" not in info
                    else None
                ),
            )
            search.run()
            gens = archive.generations(search.run_id)
        finally:
            archive.close()
    later = [g for g in gens if g.generation >= 1]
    zero, mean, per_hour = generation_pace(gens)
    return {
        "generation_0_s": round(zero, 2),
        "generation_s_mean": round(mean, 2),
        "generations_per_hour": round(per_hour, 1),
        "generations_timed": len(later),
        "full_fits": sum(g.n_promoted for g in later),
    }


def search_figures(
    loaded, pool: ReplayPool, generations: int, say: Say, cv: str | None, baseline: bool, seed_fit_evals: int | None
) -> dict:
    """The search's speed with the default settings (but `seed_fit_evals`, if given); with `cv`,
    also under --cv `cv` and the ratio of its generations' time to the plain run's; with
    `baseline`, also with the fit budgets of before the speed work (PREVIOUS_FIT_BUDGETS) and how
    much faster the defaults are."""
    from stepml_evolve.evolve.search.settings import PREVIOUS_FIT_BUDGETS

    common = {} if seed_fit_evals is None else {"seed_fit_evals": seed_fit_evals}
    say(f"offline search, {generations} generations with default settings...")
    figures = timed_search(loaded, pool, generations, say, **common)
    say(
        f"search: generation 0 {figures['generation_0_s']} s, then {figures['generation_s_mean']} s per "
        f"generation ({figures['generations_per_hour']} generations/hour)"
    )
    if cv:
        under = timed_search(loaded, pool, generations, say, cv=cv, **common)
        figures.update(
            {
                "cv": cv,
                "cv_generation_s_mean": under["generation_s_mean"],
                "cv_full_fits": under["full_fits"],
                "cv_generation_ratio": round(under["generation_s_mean"] / figures["generation_s_mean"], 2),
            }
        )
        say(
            f"search --cv {cv}: {under['generation_s_mean']} s per generation, "
            f"{figures['cv_generation_ratio']}x the plain run's"
        )
    if baseline:
        before = timed_search(loaded, pool, generations, say, **PREVIOUS_FIT_BUDGETS, **common)
        figures.update(
            {
                "baseline_generation_0_s": before["generation_0_s"],
                "baseline_generation_s_mean": before["generation_s_mean"],
                "baseline_full_fits": before["full_fits"],
                "generation_0_speedup": round(before["generation_0_s"] / figures["generation_0_s"], 2),
                "generation_speedup": round(before["generation_s_mean"] / figures["generation_s_mean"], 2),
            }
        )
        say(
            f"search with the earlier fit budgets: generation 0 {before['generation_0_s']} s, then "
            f"{before['generation_s_mean']} s per generation: the defaults are {figures['generation_0_speedup']}x "
            f"and {figures['generation_speedup']}x faster"
        )
    return figures


# BLIS against the tool on the same experiments: prefix caching, preemption, MoE (the first 3000 requests)
BLIS_BENCH_CASES = (
    ("20260217-155451-llama-2-7b-tp1-codegen", None),
    ("20260217-170634-llama-2-7b-tp1-reasoning", None),
    ("20260218-120914-mixtral-8x7b-v0-1-tp2-codegen", 3000),
)


def blis_vs_tool(blis: Path, data: Path, say: Say) -> dict:
    """Seconds per replay in BLIS (the trained_physics seed emitted and installed into a scratch copy
    of `blis`: a built checkout, or the offline snapshot with build.sh) against the tool's replay."""
    import shutil
    import subprocess
    import tempfile

    from stepml_evolve.evolve.blis.compare import compare_with_blis
    from stepml_evolve.evolve.blis.install import install_into_blis
    from stepml_evolve.evolve.go.source import find_go_tool

    program = seed_path("trained_physics")
    with tempfile.TemporaryDirectory(prefix="stepml-bench-blis-") as tmp:
        checkout = Path(tmp) / "blis"
        if (blis / "build.sh").is_file() and not (blis / "go.mod").is_file():  # the snapshot: build a copy
            go = find_go_tool("go")
            env = {**os.environ, "PATH": f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}"} if go else None
            subprocess.run(["bash", str(blis / "build.sh"), str(checkout)], check=True, capture_output=True, env=env)
        else:
            shutil.copytree(blis, checkout, symlinks=True)
        install_into_blis(str(program), None, checkout, go_test=(), say=say)
        rows = []
        for name, requests in BLIS_BENCH_CASES:
            f = compare_with_blis(load_program(program), data / name, checkout, requests=requests)
            say(
                f"blis vs tool, {name}: {f.blis_s:.2f} s vs {f.tool_s:.3f} s; mean E2E {f.e2e_diff_pct:+.3f} %, "
                f"TTFT {f.ttft_diff_pct:+.3f} %"
            )
            rows.append(
                {
                    "experiment": name,
                    "requests": requests,
                    "blis_s": round(f.blis_s, 2),
                    "tool_s": round(f.tool_s, 4),
                    "speedup": round(f.blis_s / f.tool_s, 1),
                    "e2e_diff_pct": round(f.e2e_diff_pct, 3),
                    "ttft_diff_pct": round(f.ttft_diff_pct, 3),
                }
            )
    return {"blis_vs_tool": rows}


def seed_fits(exps, pool: ReplayPool, seeds: list[str], methods: list[str], say: Say) -> list[dict]:
    """A full global fit (seed 0, default budget) of each seed program with each method: seconds,
    closed-loop replays of all training windows, and the training loss reached."""
    known = [p.stem for p in seed_paths()]
    unknown = [n for n in seeds if n not in known]
    if unknown:
        raise UserError(f"--fit-seed: no seed named {', '.join(unknown)} (have: {', '.join(known)})")
    rows = []
    for name in seeds:
        prog = load_program(seed_path(name))
        for method in methods:
            say(f"full global fit of {name} ({method})...")
            r = fit_constants(prog, exps, pool, FitConfig(seed=0, method=method))
            rows.append(
                {
                    "seed": name,
                    "method": method,
                    "fit_s": round(r.seconds, 1),
                    "replays": r.evaluations,
                    "train_loss": round(r.loss, 3),
                }
            )
            say(f"  {name} {method}: {r.seconds:.1f} s, {r.evaluations} replays, train loss {r.loss:.3f}")
    return rows


def run_bench(
    data: Path | None,
    skip_fit: bool = False,
    say: Say = print,
    search_generations: int = 4,
    workers: int | None = None,
    blis: Path | None = None,
    fit_seeds: list[str] | None = None,
    fit_methods: list[str] | None = None,
    search_cv: str | None = None,
    baseline: bool = False,
    seed_fit_evals: int | None = None,
    reference: Path | None = None,
) -> dict:
    """The throughput figures; with `reference` (an earlier `evolve bench --json` output), also each
    timing figure against it (`against_reference`), so a regression shows in one command."""
    earlier = read_reference(reference) if reference is not None else None  # a bad file fails before any timing
    loaded = load_data(data if data is not None else default_bench_data())
    exps = loaded.experiments
    prog = load_program(seed_path(BENCH_PROGRAM))
    compiled = compile_program(prog)
    consts = np.array(list(prog.constants.values()))
    replay(exps[0], compiled, consts)  # compile/load the numba code outside the timings
    figures: dict = {
        "data": loaded.label,
        "synthetic": loaded.synthetic,
        "cores": os.cpu_count(),
        "program": f"seeds/{BENCH_PROGRAM}.py",
        "fit_s": None,
        "fits": None,
        "generations_per_hour": None,
    }  # null when skipped, still listed

    largest = max(exps, key=lambda e: e.n_requests)
    n_max = largest.n_requests
    per_exp = {e.name: _median_time(lambda e=e: replay(e, compiled, consts)) for e in exps}
    figures["replay_s_largest"] = round(max(per_exp[e.name] for e in exps if e.n_requests == n_max), 4)
    figures["replay_requests_largest"] = n_max
    figures["replay_s_slowest_any"] = round(max(per_exp.values()), 4)
    say(
        f"replay: largest experiment ({n_max} requests) {figures['replay_s_largest']} s; slowest of all "
        f"{figures['replay_s_slowest_any']} s"
    )

    with ReplayPool(exps, workers) as pool:
        vectors = [consts] * len(exps)
        figures["full_eval_s"] = round(_median_time(lambda: pool.score(compiled, vectors, ("test",))), 4)
        figures["workers"] = pool.workers
        say(f"full evaluation of {len(exps)} experiments on {pool.workers} threads: {figures['full_eval_s']} s")
        t0 = time.perf_counter()
        q = fit_constants(prog, exps, pool, quick_config(0, exps))
        figures["quick_fit_s"] = round(time.perf_counter() - t0, 2)
        figures["quick_fit_evals"] = q.evaluations
        say(
            f"quick fit ({BENCH_PROGRAM}): {figures['quick_fit_s']} s ({q.evaluations} replays of the screening windows)"
        )
        if not skip_fit:
            figures["fits"] = seed_fits(
                exps, pool, fit_seeds or [p.stem for p in seed_paths()], fit_methods or list(METHODS), say
            )
            first = figures["fits"][0]
            figures["fit_s"], figures["fit_evals"], figures["fit_train_loss"] = (
                first["fit_s"],
                first["replays"],
                first["train_loss"],
            )
        if search_generations > 0:
            figures.update(search_figures(loaded, pool, search_generations, say, search_cv, baseline, seed_fit_evals))
    if blis is not None:
        if loaded.synthetic:
            say("blis vs tool: needs the real data (--data ../shared/data/replay); skipped")
            figures["blis_vs_tool"] = None
        else:
            figures.update(blis_vs_tool(Path(blis), Path(loaded.directory), say))
    if earlier is not None:
        compared = against_reference(figures, earlier)
        figures["against_reference"] = {"file": str(reference), "data": earlier.get("data"), "figures": compared}
        if earlier.get("data") != figures["data"]:
            say(
                f"note: the reference {reference} was measured on {cut(str(earlier.get('data')))}, not {figures['data']}"
            )
        say(
            f"against {reference}: "
            + (", ".join(f"{k} {v['ratio']}x" for k, v in compared.items()) or "no figure measured in both")
        )
    return figures
