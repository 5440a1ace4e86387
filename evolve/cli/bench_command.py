"""`evolve bench`: throughput figures, the cluster's, or the known-truth worlds' benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from stepml_evolve.evaluator.choices import HELD_OUT_FITS, METHODS
from stepml_evolve.evaluator.fit.config import FitConfigError
from stepml_evolve.evaluator.known_truth import GRID_SIZES
from stepml_evolve.evolve.search import CV_MODES, ENGINES, LLMSettings, SearchConfig

from .console import out, say
from .options import (
    WorkersOption,
)
from .settings_options import settings_options


# with --worlds, every search runs with these settings, as evolve run does
@settings_options(
    SearchConfig, only=("modulate", "switch", "residual", "residual_refit", "time_components", "unexercised", "physics")
)
def bench_cmd(
    data: Path | None = typer.Option(
        None, "--data", help="Replay data (default: ../shared/data/replay if present, else synthetic)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    skip_fit: bool = typer.Option(False, "--skip-fit", help="Skip the full fits of the seeds (minutes to an hour)."),
    fit_seed: list[str] | None = typer.Option(
        None, "--fit-seed", help="Seed programs to fit (repeatable; default all of seeds/)."
    ),
    fit_method: list[str] | None = typer.Option(
        None, "--fit-method", help=f"Fitting methods to time (repeatable: {', '.join(METHODS)}; default all)."
    ),
    search_generations: int = typer.Option(
        4,
        "--search-generations",
        min=0,
        help="Search generations timed after generation 0 (the seed fits, timed too); 0 skips the search.",
    ),
    search_cv: Literal[CV_MODES] = typer.Option(
        "none",
        "--search-cv",
        help="Also time the search under this --cv protocol, and its ratio to the plain search.",
    ),
    baseline: bool = typer.Option(
        False,
        "--baseline",
        help="Also time the search with the fit budgets of before the speed work, and the speedup.",
    ),
    seed_fit_evals: int | None = typer.Option(
        None,
        "--seed-program-fit-evals",
        min=1,
        help="Seed-fit budget of the timed searches (default: the search's, about 10 minutes of "
        "generation 0 on the real data).",
    ),
    workers: WorkersOption = None,
    blis: Path | None = typer.Option(
        None,
        "--blis",
        help="Also time BLIS (a built checkout, or the offline snapshot "
        "../shared/blis) against the tool's replay on three real experiments.",
    ),
    cluster: str | None = typer.Option(
        None,
        "--cluster",
        help="Instead of the figures above: replays/s and generations/hour "
        "on local threads against this Ray cluster (an address as for evolve run --cluster), "
        "for each --remote-workers count.",
    ),
    remote_workers: list[int] | None = typer.Option(
        None, "--remote-workers", min=1, help="With --cluster: replays in flight on it (repeatable; default 1, 2, 4)."
    ),
    worlds: bool = typer.Option(
        False,
        "--worlds",
        help="Instead of the figures above: the known-truth worlds' benchmark (per world and held-out "
        "split: best fitted seed, search winner and the law, held out; see docs/HISTORY.md).",
    ),
    world: list[str] | None = typer.Option(
        None, "--world", help="With --worlds: only this world (repeatable; default all, or two with --quick)."
    ),
    split: list[str] | None = typer.Option(
        None, "--split", help="With --worlds: only this split (repeatable; default all, or by-gpu with --quick)."
    ),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="With --worlds: two worlds, small grids, one split, a few generations, seeds fitted from one start, "
        "one held-out fit (minutes).",
    ),
    generations: int | None = typer.Option(
        None, "--generations", min=0, help="With --worlds: each search's generations (default: evolve run's)."
    ),
    world_size: Literal[tuple(GRID_SIZES)] | None = typer.Option(
        None,
        "--size",
        help="With --worlds: the grid, full (42 experiments), medium (21) or small (12); default full, --quick small.",
    ),
    seed: int = typer.Option(
        0, "--seed", min=0, help="With --worlds: the worlds' generator's seed, and the searches' unless --search-seed."
    ),
    search_seed: int | None = typer.Option(
        None,
        "--search-seed",
        min=0,
        help="With --worlds: the searches' seed, when it is not --seed: another draw of every search on the "
        "same worlds and baselines (a world's outcome moves with it).",
    ),
    search_seeds: int | None = typer.Option(
        None,
        "--search-seeds",
        min=1,
        help="With --worlds: search every split with this many seeds (--search-seed, then the next ones), a "
        "result each; default 2 (--quick: 1). A resumed benchmark may add seeds.",
    ),
    search_engine: Literal[ENGINES] = typer.Option(
        ENGINES[0], "--engine", help="With --worlds: the searches' engine, as for evolve run (openevolve needs --llm)."
    ),
    llm: str | None = typer.Option(None, "--llm", help="With --worlds: the searches' LLM, as for evolve run."),
    llm_base_url: str | None = typer.Option(
        None, "--llm-base-url", help="With --worlds: its OpenAI-compatible server URL."
    ),
    select: str = typer.Option(
        "validation",
        "--select",
        help="With --worlds: how each search picks its winner: validation (emit-go best of a default "
        "run) or inner (the search runs --cv groups:split-NAME.inner.yaml, the split's kind of "
        "extrapolation inside its train configurations, and the lowest such CV loss wins).",
    ),
    bench_front_cv: str | None = typer.Option(
        None,
        "--front-cv",
        help="With --worlds: how each search's end cross-validates its front and seeds, which the "
        "deployment rules rank by: lomo (the default, as evolve run), lowo, inner (the split's own "
        "question inside its train configurations, split-NAME.inner.yaml) or none (--quick's default).",
    ),
    held_out_fits: int | None = typer.Option(
        None,
        "--held-out-fits",
        min=1,
        help="With --worlds: fit each program this many times, as a search fits its seeds (from its own "
        "constants, then from draws from its priors; fit seeds --seed, --seed + 1, ...), and score one of "
        "them held out (--held-out-pick): one fit's held-out loss depends on where it ended. Default "
        f"{HELD_OUT_FITS} (--quick: 1).",
    ),
    held_out_pick: str = typer.Option(
        "train",
        "--held-out-pick",
        help="With --worlds and several fits: score the fit with the lowest train loss (train: a "
        "multi-start fit, the held-out data never chooses) or the median held-out loss (median, the "
        "rule of benchmarks started before this option).",
    ),
    archive_top: int = typer.Option(
        0,
        "--archive-top",
        min=0,
        help="With --worlds: also score held out, as the winner is, each search's K programs of lowest "
        "CV loss and K of lowest train loss, and report the best of them and the winner: whether the "
        "archive holds a program that generalizes which the selection rule did not pick (a diagnostic "
        "the held-out data chooses, never the winner; on a finished benchmark with --resume, adds it).",
        metavar="K",
    ),
    bench_out: Path = typer.Option(
        Path("bench-worlds"),
        "--out",
        help="With --worlds: a new directory for the worlds' data, split files, search archives and results.",
    ),
    reference: Path | None = typer.Option(
        None,
        "--reference",
        help="An earlier `evolve bench --json` output: also report each timing figure (replay, evaluation, "
        "fits, generation 0, seconds per generation, the --cv ratio) as a ratio against it (above 1: slower).",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="With --worlds: continue the benchmark in --out (same settings; a larger --generations "
        "extends every search), keeping what it finished.",
    ),
    settings: dict | None = None,
):
    """Throughput figures: replay, full evaluation, quick fit, each seed's full fit by each method, search generations per hour."""
    from stepml_evolve.evaluator.replay.executor import Cluster
    from stepml_evolve.evolve.commands.bench import run_bench
    from stepml_evolve.evolve.commands.bench_cluster import cluster_bench
    from stepml_evolve.evolve.commands.bench_worlds import bench_worlds
    from stepml_evolve.evolve.commands.bench_worlds_results import worlds_summary

    from .tables import cluster_bench_table, dumps, worlds_bench_table, worlds_rules_table

    if worlds or world or split or quick or world_size or llm or resume:
        results = bench_worlds(
            bench_out,
            worlds=world,
            splits=split,
            quick=quick,
            size=world_size,
            generations=generations,
            seed=seed,
            search_seed=search_seed,
            search_seeds=search_seeds,
            selection=select,
            front_cv=bench_front_cv,
            engine=search_engine,
            llm=LLMSettings(llm, base_url=llm_base_url) if llm else None,
            fits=held_out_fits,
            pick=held_out_pick,
            modulate=settings["modulate"],
            switch=settings["switch"],
            residual=settings["residual"],
            residual_refit=settings["residual_refit"],
            time_components=settings["time_components"],
            unexercised=settings["unexercised"],
            physics=settings["physics"],
            archive_top=archive_top,
            resume=resume,
            say=say,
        )
        report = {"results": [r.to_json() for r in results], "summary": worlds_summary(results)}
        (bench_out / "bench-worlds.json").write_text(dumps(report) + "\n")
        if as_json:
            print(dumps(report))
        else:
            out.print(worlds_bench_table(results, report["summary"]))
            if report["summary"]["rules"]:
                out.print(worlds_rules_table(report["summary"]))
        return
    unknown = sorted(set(fit_method or ()) - set(METHODS))
    if unknown:
        raise FitConfigError(f"--fit-method: {', '.join(unknown)} is not one of {', '.join(METHODS)}")
    where = Cluster.of(cluster, (remote_workers or [None])[0])
    if where is not None:
        figures = cluster_bench(data, where, remote_workers or [1, 2, 4], workers, search_generations, say)
        if as_json:
            print(dumps(figures))
        else:
            out.print(cluster_bench_table(figures))
        return
    figures = run_bench(
        data,
        skip_fit=skip_fit,
        say=say,
        search_generations=search_generations,
        workers=workers,
        blis=blis,
        fit_seeds=fit_seed,
        fit_methods=fit_method,
        search_cv=None if search_cv == "none" else search_cv,
        baseline=baseline,
        seed_fit_evals=seed_fit_evals,
        reference=reference,
    )
    if as_json:
        print(dumps(figures))
    else:
        for k, v in figures.items():
            if k not in ("fits", "against_reference"):
                out.print(f"{k:24s} {v}")
        for row in figures.get("fits") or []:
            out.print(
                f"fit {row['seed']:18s} {row['method']:13s} {row['fit_s']:8.1f} s {row['replays']:6d} replays  "
                f"train loss {row['train_loss']}"
            )
        for name, row in (figures.get("against_reference") or {}).get("figures", {}).items():
            out.print(f"{name:24s} {row['value']} against {row['reference']}: {row['ratio']}x")
