"""The commands on one program: `evolve eval`, `fit`, `cv`, `emit-go` and `blis-compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from stepml_evolve.evaluator.choices import PHYSICS_MODES, SCOPES
from stepml_evolve.evaluator.data.experiments import SCORED_SPLITS
from stepml_evolve.evaluator.dsl.program import load_program
from stepml_evolve.evaluator.fit.config import FitConfig
from stepml_evolve.evolve.blis.install import DEFAULT_BACKEND, DEFAULT_GO_TEST, BlisError, install_into_blis
from stepml_evolve.evolve.commands import EvaluationSetup
from stepml_evolve.evolve.deploy.choices import DEFAULT_RULE, JUDGES
from stepml_evolve.evolve.go.parity import DEFAULT_SAMPLES
from stepml_evolve.evolve.go.source import DEFAULT_NAME, DEFAULT_TARGET, TARGETS
from stepml_evolve.evolve.option_fields import from_options

from .console import err, error, out, say
from .options import (
    SETUP,
    ClusterOption,
    EmitPhysicsOption,
    MethodOption,
    PhysicsOption,
    PromptReuseOption,
    RemoteWorkersOption,
)
from .progress import fit_progress
from .settings_options import settings_options

FIT = FitConfig()


Split = Literal[SCORED_SPLITS]
Scope = Literal[SCOPES]
GoTarget = Literal[tuple(TARGETS)]


def _check_program(program: Path) -> None:
    """PROGRAM's one-line error (no such file, not a program), the first thing its backend would
    raise, raised before the command imports that backend and with it the replay: a mistyped path
    answers at once."""
    load_program(program)


@settings_options(EvaluationSetup)  # --data, --prompt-reuse, ... (the options every replaying command takes)
def eval_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    split: Split = typer.Option(
        "test", "--split", help="Split to score: a temporal window, or all (whole experiments)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    settings: dict | None = None,
):
    """Replay every experiment closed-loop with PROGRAM; print observed vs predicted and APE."""
    setup = from_options(EvaluationSetup, settings)
    _check_program(program)
    from stepml_evolve.evolve.commands.eval import evaluate_program

    from .tables import dumps, floor_text, loss_text, metrics_table

    result = evaluate_program(program, setup, split, say=say)
    everywhere = result.failed_everywhere(setup.skip_bad)  # one line, not a table of failures and loss inf
    if as_json:
        print(dumps(result.to_json()))
    elif everywhere is None:
        out.print(metrics_table(result.rows, f"{program} on {result.data.label}, {split} split"))
        out.print(f"loss ({split}): {loss_text(result.loss)}  ({result.objective.describe()})")
        out.print(floor_text(result.floor), markup=False, highlight=False, soft_wrap=True)
        for rule, message in result.physics:
            if message != result.floor.reason():  # the floor's own line said it
                out.print(f"physics: --physics check refuses it [{rule}]: {message}", markup=False, soft_wrap=True)
    if everywhere is not None:
        raise everywhere
    for r in result.failed:
        error(f"{program} on {r.name}: {r.error}")
    setup.refuse_bad(result.data)  # after the good ones' scores, as data check reports its rows
    if result.failed:
        raise typer.Exit(2)


@settings_options(EvaluationSetup)  # --data, --prompt-reuse, ... (the options every replaying command takes)
def fit_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    seed: int = typer.Option(
        FIT.seed, "--seed", min=0, help="CMA-ES seed: same seed and data give the same constants."
    ),
    scope: Scope = typer.Option(
        FIT.scope, "--scope", help="One constant set (global), one per model, or one per experiment."
    ),
    out_path: Path | None = typer.Option(
        None, "--out", help="Fitted program file (default: <program>.fitted.py here)."
    ),
    max_evals: int | None = typer.Option(
        FIT.max_evals,
        "--max-evals",
        min=1,
        help="Closed-loop evaluations per group (default by method and size; cmaes rounds up to whole generations).",
    ),
    quick: bool = typer.Option(
        False, "--quick", help="Screening fit: subset of experiments, short window, small budget."
    ),
    restarts: int = typer.Option(
        FIT.restarts,
        "--restarts",
        min=0,
        help="Extra runs from the best point so far (a fresh trust region or CMA-ES, each with the full budget).",
    ),
    starts: int = typer.Option(
        1,
        "--starts",
        min=1,
        help="Fits from the program's constants and from draws from their priors (as a search fits its "
        "seeds: evolve run --seed-program-starts); the best is kept, and each one's train loss printed.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    method: MethodOption = FIT.method,
    cluster: ClusterOption = None,
    remote_workers: RemoteWorkersOption = None,
    physics: PhysicsOption = PHYSICS_MODES[0],
    profile: bool = typer.Option(
        True,
        "--profile/--no-profile",
        help="After the fit, profile each constant (2 closed-loop evaluations each) and print whether the "
        "data decided it, its prior holds it, or a bound does.",
    ),
    settings: dict | None = None,
):
    """Fit PROGRAM's constants on the train split, then score validate and test."""
    from stepml_evolve.evaluator.replay.executor import Cluster

    setup = from_options(EvaluationSetup, settings, cluster=Cluster.of(cluster, remote_workers))
    _check_program(program)
    from stepml_evolve.evolve.commands.fit import fit_program

    from .tables import dumps, floor_text, identifiability_table, loss_text, metrics_table

    fitted = fit_program(
        program,
        setup,
        seed=seed,
        scope=scope,
        out=out_path,
        max_evals=max_evals,
        quick=quick,
        restarts=restarts,
        starts=starts,
        method=method,
        physics=physics,
        profile=profile,
        say=say,
        progress=fit_progress,
    )
    if as_json:
        print(dumps(fitted.to_json()))
        return
    for split, rows in fitted.rows.items():
        out.print(metrics_table(rows, f"fitted {program.name} ({scope} scope), {split} split"))
        out.print(f"loss ({split}): {loss_text(fitted.losses[split])}")
    r = fitted.result
    for group, reports in fitted.identifiability.items():
        where = "" if group == "all" else f", group {group}"
        out.print(identifiability_table(reports, f"what decided each constant of {program.name}{where}"))
    for group, check in fitted.floor.items():
        out.print(("" if group == "all" else f"{group}: ") + floor_text(check), markup=False, soft_wrap=True)
    penalty = sum(r.penalties.values())
    if len(fitted.starts) > 1:
        each = ", ".join(f"{s.loss:.3f}" for s in fitted.starts)
        out.print(f"train loss from each of {len(fitted.starts)} starts: {each} (the best kept)")
    out.print(
        f"train loss {r.loss:.3f} (+ {penalty:.3f} from the priors) after {r.evaluations} closed-loop evaluations "
        f"({fitted.config.method}) in {r.seconds:.1f} s; fitted program: {', '.join(map(str, fitted.written))}"
    )


@settings_options(EvaluationSetup)  # --data, --prompt-reuse, ... (the options every replaying command takes)
def cv_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    protocol: str = typer.Option(
        ...,
        "--protocol",
        help="lomo (leave one model out), lowo (leave one workload out) or groups:FILE "
        "(YAML: fold name -> experiment names it holds out).",
    ),
    seed: int = typer.Option(FIT.seed, "--seed", min=0, help="Fit seed: same seed and data give the same numbers."),
    max_evals: int | None = typer.Option(
        FIT.max_evals, "--max-evals", min=1, help="Closed-loop evaluations per fold fit (default by method and size)."
    ),
    in_distribution: bool = typer.Option(
        False,
        "--in-distribution",
        help="Also fit on every experiment and score them all on all requests: "
        "the errors when nothing is held out, beside the CV errors.",
    ),
    starts: int = typer.Option(
        1,
        "--starts",
        min=1,
        help="Fit each fold from the program's constants and from draws from their priors (as --starts in "
        "evolve fit), keep each fold's best train fit, and print the CV loss each start alone gives.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    method: MethodOption = FIT.method,
    cluster: ClusterOption = None,
    remote_workers: RemoteWorkersOption = None,
    physics: PhysicsOption = PHYSICS_MODES[0],
    settings: dict | None = None,
):
    """Cross-validate PROGRAM: per fold, fit on the other experiments' train split, score the held-out ones on all requests."""
    from stepml_evolve.evaluator.replay.executor import Cluster

    setup = from_options(EvaluationSetup, settings, cluster=Cluster.of(cluster, remote_workers))
    _check_program(program)
    from stepml_evolve.evolve.commands.cv import cross_validate_program

    from .tables import cv_summary_table, dumps, loss_text, metrics_table

    done = cross_validate_program(
        program,
        protocol,
        setup,
        seed=seed,
        max_evals=max_evals,
        method=method,
        in_distribution=in_distribution,
        starts=starts,
        physics=physics,
        say=say,
        progress=fit_progress,
    )
    if as_json:
        print(dumps(done.to_json()))
        return
    for f in done.cv.folds:
        out.print(
            metrics_table(
                f.rows,
                f"fold {f.fold.name}: fitted on {len(f.fold.train)} experiments "
                f"(train loss {f.fit.loss:.3f}, {f.fit.evaluations} evaluations), held out on all requests",
            )
        )
    out.print(cv_summary_table(done.cv.summary(), f"{program.name}, {done.cv.protocol}: held-out experiments"))
    if done.cv.in_distribution:
        inside = done.in_distribution()
        out.print(
            cv_summary_table(
                inside["summary"],
                f"{program.name}, in-distribution: fitted on all {len(done.cv.in_distribution.fold.train)} experiments",
            )
        )
        out.print(f"in-distribution loss: {loss_text(inside['loss'])}")
    if done.cv.start_losses:
        each = ", ".join(f"{v:.3f}" for v in done.cv.start_losses)
        out.print(f"CV loss had every fold kept one start, for each of {starts} starts: {each}")
    kept = " (each fold keeps its best train fit)" if done.cv.start_losses else ""
    out.print(f"CV loss ({done.cv.protocol}): {loss_text(done.cv.loss)}{kept}  ({done.config.objective.describe()})")


@settings_options(EvaluationSetup)  # --data, --prompt-reuse, ... (the options every replaying command takes)
def explain_cmd(
    program: str = typer.Argument(
        ..., help="A program file (.py), or an archive's program: an id or a deployment rule (as emit-go takes them)."
    ),
    archive_dir: Path | None = typer.Option(
        None, "--archive", help="Archive directory (default: the newest under runs/), for an id or a rule."
    ),
    split: Split = typer.Option(
        "train", "--split", help="The split whose requests are explained (train: what a search's screening reads)."
    ),
    top: int = typer.Option(10, "--top", min=1, help="Associations and screened terms shown."),
    refit: bool = typer.Option(
        False,
        "--refit",
        help="Screen each term beside the program's own constants refitted (linearized): what a term adds once "
        "the constants that absorbed part of its mechanism move too.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    settings: dict | None = None,
):
    """Where PROGRAM's error grows (by context, chunk, batch, decode share, model, TP, workload) and
    which candidate terms would explain it, screened on its residuals."""
    setup = from_options(EvaluationSetup, settings)
    if program.endswith(".py"):
        _check_program(Path(program))
    from stepml_evolve.evolve.commands.explain import explain_program, explained_program

    from .tables import associations_table, dumps, screening_table

    prog, label = explained_program(program, archive_dir)
    result = explain_program(prog, label, setup, split, say=say, refit=refit)
    if as_json:
        print(dumps(result.to_json(top)))
        return
    where = f"{label} on {result.data.label}, {split} split ({result.requests:,} requests)"
    out.print(associations_table(result.associations, f"where the error grows: {where}", top))
    s = result.screening
    out.print(
        screening_table(
            s,
            f"terms screened on its residuals: {len(s.passed)} of {len(s.results) + s.skipped} pass "
            f"(on shuffled residuals {s.false_passes:.1%} would; {s.capped} bounded by the tether)",
            top,
        )
    )
    if s.skipped:
        out.print(f"{s.skipped} candidate(s) skipped: their column is not a finite number somewhere")
    for a, b, gain in s.pairs[:3]:
        out.print(f"pair: + {a.term.shown()} + {b.term.shown()}: {gain:.1%} of the residual together", markup=False)


# the run options that only an LLM reads: refused without --llm rather than silently ignored
def emit_go_cmd(
    program: str = typer.Argument(
        DEFAULT_RULE,
        help="A deployment rule, a program id from the archive, or a program file (.py). The rules rank "
        "by CV loss (of the protocol most programs are scored under; ties: lomo, else lowo) when the archive has "
        "CV scores, else by validation loss: guarded "
        "(the default: the lowest loss among the seed programs and the programs that beat their own seed's loss by "
        "more than --within % (default 20) and whose step times stay within 1.5x of their seed's on 95 % of "
        "the floor's envelope), tethered (the lowest loss among programs whose step times stay within "
        "--within % over 1x (default 50: 1.5x) of their seed's on 95 % of the floor's envelope, else the "
        "best seed), best (the lowest loss), simplest (lowest complexity within --within % of best), "
        "lineage (best's nearest ancestor each of whose steps gained more than --within %), anchored "
        "(best, unless it beats the best seed's validation loss by at most --within %: then that seed), "
        "penalized (the lowest loss plus its constants' distance from their priors).",
    ),
    archive_dir: Path | None = typer.Option(
        None, "--archive", help="Archive directory (default: the newest under runs/)."
    ),
    within: float | None = typer.Option(
        None,
        "--within",
        min=0.0,
        help="With simplest: percent over the best loss allowed; with lineage and anchored: the gain that "
        "counts (default 5); with tethered: how far over 1x of its seed's a program's step times may go "
        "(default 50: 1.5x); with guarded: how much a program must beat its own seed's loss by (default 20).",
    ),
    judge: Literal[JUDGES] | None = typer.Option(
        None,
        "--judge",
        help="With a rule: what ranks the cross-validated programs: loss (the CV loss, the default: held-out "
        "RMS APE of mean E2E + of mean TTFT) or e2e (the held-out mean E2E error, steadier where an overloaded "
        "run's TTFT dominates the loss).",
    ),
    out_path: Path | None = typer.Option(
        None, "--out", help="Go file to write (default stepml_evolved.go; not with --blis)."
    ),
    test_out: Path | None = typer.Option(None, "--test-out", help="Also write a Go test checking Go against Python."),
    target: GoTarget = typer.Option(
        DEFAULT_TARGET,
        "--target",
        help="The BLIS LatencyModel to implement: " + "; ".join(f"{t.name}: {t.fits}" for t in TARGETS.values()) + ".",
    ),
    name: str = typer.Option(DEFAULT_NAME, "--name", help="Go identifier prefix: <name>Model, New<name>Model, ..."),
    samples: int = typer.Option(DEFAULT_SAMPLES, "--samples", min=1, help="Sample batches in the generated test."),
    blis: Path | None = typer.Option(
        None,
        "--blis",
        help="Install into this BLIS checkout: model and test in sim/latency/, "
        "the backend registered, then go build, vet and test there.",
    ),
    backend: str | None = typer.Option(
        None, "--backend", help=f"With --blis: the backend name (default {DEFAULT_BACKEND})."
    ),
    go_test: list[str] | None = typer.Option(
        None,
        "--go-test",
        help="With --blis: the packages to test (default ./sim/...; several: repeat, or space-separated in one value).",
    ),
    physics: EmitPhysicsOption = PHYSICS_MODES[0],
):
    """Emit a program as Go (package latency) implementing BLIS's LatencyModel (or install it with --blis)."""
    from stepml_evolve.evolve.go.emission import emit_program

    if blis is None and (backend or go_test):
        raise BlisError("--backend and --go-test go with --blis")
    if blis is not None and (out_path or test_out):
        raise BlisError("--out and --test-out do not go with --blis (it writes sim/latency/<backend>.go and its test)")
    if blis is not None:
        if within is not None or judge is not None:
            raise BlisError("--within and --judge do not go with --blis yet; emit with --out instead")
        install_into_blis(
            program,
            archive_dir,
            blis,
            target,
            name,
            backend or DEFAULT_BACKEND,
            samples,
            go_test or DEFAULT_GO_TEST,
            physics=physics,
        )
        return
    out_path = out_path or Path("stepml_evolved.go")
    choice = emit_program(
        program,
        archive_dir,
        out_path,
        test_out,
        target=target,
        name=name,
        samples=samples,
        within=within,
        physics=physics,
        judge=judge,
    )
    if choice is not None:
        err.print(choice.describe(), markup=False, highlight=False, soft_wrap=True)
    out.print(f"wrote {out_path} ({name}Model, target {target})")
    if test_out:
        out.print(f"wrote {test_out} ({samples} sample batches checked against Python)")


def blis_compare_cmd(
    program: str = typer.Argument(
        DEFAULT_RULE, help="A deployment rule (as emit-go's), a program id from the archive, or a program file (.py)."
    ),
    blis: Path = typer.Option(
        ..., "--blis", help="A built BLIS checkout; the program is installed there as emit-go --blis does."
    ),
    data: Path = typer.Option(..., "--data", help="Directory of replay experiments (or one experiment directory)."),
    archive_dir: Path | None = typer.Option(
        None, "--archive", help="Archive directory (default: the newest under runs/)."
    ),
    experiment: list[str] | None = typer.Option(None, "--experiment", help="Only these experiments (repeatable)."),
    requests: int | None = typer.Option(
        None, "--requests", min=1, help="Replay only each experiment's first N requests."
    ),
    backend: str | None = typer.Option(None, "--backend", help="The backend name in BLIS (default stepml-evolved)."),
    prompt_reuse: PromptReuseOption = SETUP.prompt_reuse,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    physics: EmitPhysicsOption = PHYSICS_MODES[0],
):
    """Replay experiments with the program in BLIS and in the tool (BLIS semantics): per-request agreement, means, seconds."""
    from stepml_evolve.evaluator.data.experiment_reader import experiment_dirs
    from stepml_evolve.evolve.blis.compare import compare_program_in_blis

    from .tables import blis_comparison_table, dumps

    dirs = [d for d in experiment_dirs(data) if not experiment or d.name in experiment]
    if not dirs:
        raise BlisError(f"{data}: no experiment directories{' named ' + ', '.join(experiment) if experiment else ''}")
    rows = compare_program_in_blis(
        program,
        archive_dir,
        blis,
        dirs,
        backend=backend,
        requests=requests,
        say=say,
        prompt_reuse=prompt_reuse,
        physics=physics,
    )
    if as_json:
        print(dumps([r.to_json() for r in rows]))
        return
    out.print(blis_comparison_table(rows))
