"""The `evolve` command line: each command parses its options, calls one library function and
prints the result. User errors (`UserError`) are reported once, by `console.CommandGroup`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import typer

from stepml_evolve.archive.browse import DEFAULT_RULE
from stepml_evolve.evaluator.datasets import SYNTHETIC_SEED, check_data, write_synthetic_sample
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.executor import Cluster
from stepml_evolve.evaluator.experiments import SCORED_SPLITS
from stepml_evolve.evaluator.fitting import METHODS, QUICK_EVALS, SCOPES, FitConfig, FitConfigError
from stepml_evolve.evaluator.importers import FORMATS as IMPORT_FORMATS
from stepml_evolve.evaluator.importers import import_experiment
from stepml_evolve.evaluator.importers.blis_trace_export import (
    DEFAULT_LATENCY_MODEL,
    DEFAULT_SEED,
    export_experiment_dir,
)
from stepml_evolve.evaluator.soundness import PHYSICS_MODES
from stepml_evolve.evaluator.synthetic import SAMPLE_SIZES
from stepml_evolve.evaluator.worlds import GRID_SIZES, GRIDS, load_world, world_names, write_world
from stepml_evolve.evolve.blis.install import DEFAULT_BACKEND, DEFAULT_GO_TEST, BlisError, install_into_blis
from stepml_evolve.evolve.commands import (
    ENGINES,
    PARENT_RULES,
    EvaluationSetup,
    LLMSettings,
    cluster_bench,
    cross_validate_program,
    emit_program,
    engine_rule,
    evaluate_program,
    fit_program,
    rule_flag,
    run_bench,
    run_search,
)
from stepml_evolve.evolve.commands.bench_worlds import bench_worlds
from stepml_evolve.evolve.commands.bench_worlds import summary as worlds_summary
from stepml_evolve.evolve.go.emit import DEFAULT_NAME, DEFAULT_TARGET, TARGETS
from stepml_evolve.evolve.go.parity import DEFAULT_SAMPLES
from stepml_evolve.evolve.search import CV_MODES, FRONT_CV_MODES, TIME_COMPONENT_MODES, UNEXERCISED_MODES, SearchConfig

from .archive import archive_app
from .console import CommandGroup, err, error, out, say
from .options import (
    SETUP,
    ClusterOption,
    DataOption,
    Method,
    MethodOption,
    ObjectiveOption,
    OutputLenOption,
    PhysicsOption,
    PromptReuseOption,
    RemoteWorkersOption,
    SemanticsOption,
    SkipBadOption,
    WeightsOption,
    WorkersOption,
    require_with,
)
from .progress import fit_progress, run_progress
from .tables import (
    blis_comparison_table,
    cluster_bench_table,
    cv_summary_table,
    dumps,
    experiments_table,
    floor_text,
    identifiability_table,
    loss_text,
    metrics_table,
    run_summary_tables,
    worlds_bench_table,
    worlds_rules_table,
    worlds_table,
)

app = typer.Typer(
    cls=CommandGroup,
    add_completion=False,
    no_args_is_help=True,
    help="Discover step-time programs for LLM-inference simulators.",
)
data_app = typer.Typer(cls=CommandGroup, no_args_is_help=True, help="Inspect and generate experiment data.")
app.add_typer(data_app, name="data")
app.add_typer(archive_app, name="archive")

SEARCH, FIT = SearchConfig(), FitConfig()


def _surrogate_budget(default: int | None, flag: str, whose: str):
    """A trust region's surrogate evaluations per iteration, as an option of `evolve run`."""
    return typer.Option(
        default,
        flag,
        min=0,
        help=f"{whose} (trust region): surrogate evaluations per iteration (0: 200 + 40 per constant).",
    )


def _operator_share(operator: str, what: str):
    """An opt-in symbolic operator's share of the children, as an option of `evolve run` and `evolve bench`."""
    return typer.Option(
        getattr(SEARCH, operator),
        f"--{operator}",
        min=0.0,
        max=0.99,
        help=f"Share of the symbolic children made by `{operator}`: {what} (0: not used).",
    )


PARENT_RULE_HELP = {  # what each rule of PARENT_RULES does when on, and what its off mode allows
    "time_components": "reject a child that drops a time component (f.gemm_pf ... f.allreduce) its first "
    "parent uses, rule 'time-components'; free: children may drop them",
    "unexercised": "reject a child that uses a component the data never varies (f.allreduce when every "
    "experiment runs at tp 1, f.tp at one TP, f.layers of one model) more often than its first parent, "
    "rule 'unexercised': no fit can judge such a term; allow: admit them",
}


def _parent_rule_option(name: str, what: str = ""):
    """The option of a rule of PARENT_RULES (--time-components, --unexercised), as an option of
    `evolve run` and `evolve bench`; None when not given, its default depending on --engine."""
    on, off = PARENT_RULES[name]
    return typer.Option(
        None,
        rule_flag(name),
        show_default=False,
        help=f"{what}{on} (the default): {PARENT_RULE_HELP[name]} "
        f"(--engine openevolve runs with {off} and refuses {on}).",
    )


OPERATOR_SHAPES = {
    "modulate": "a time component f.T becomes f.T * (1 + k * f.n) or f.T * (1 + k / f.n) for a count n of the step",
    "switch": "a change of regime at a fitted threshold t of a step's count n: f.T becomes "
    "(f.T * k if f.n > t else f.T), or the step time gains + (k * X if f.n > t else 0)",
}


Split = Literal[SCORED_SPLITS]
Scope = Literal[SCOPES]
GoTarget = Literal[tuple(TARGETS)]
ImportFormat = Literal[IMPORT_FORMATS]


@data_app.command("check")
def data_check(
    data: DataOption = None,
    output_len: OutputLenOption = SETUP.output_len,
    prompt_reuse: PromptReuseOption = SETUP.prompt_reuse,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """Validate experiments and summarize each: model, TP, requests, observed means, split sizes, prompt reuse."""
    check = check_data(data, output_len, prompt_reuse)
    if as_json:
        print(json.dumps(check.to_json(), indent=2))
    else:
        out.print(experiments_table(check.experiments, f"experiments in {check.label}"))
    for e in check.errors:
        error(str(e))
    if check.errors:
        raise typer.Exit(2)


@data_app.command("synth")
def data_synth(
    out_dir: Path = typer.Option(..., "--out", help="Directory to write the synthetic experiments into."),
    seed: int = typer.Option(SYNTHETIC_SEED, min=0, help=f"Generator seed ({SYNTHETIC_SEED} is the built-in sample)."),
    size: Literal[tuple(dict.fromkeys([*SAMPLE_SIZES, *GRID_SIZES]))] | None = typer.Option(
        None,
        help="full, or small (a fifth of the requests; a world: 12 configurations of 120 requests), or for a "
        "world medium (21 of 120); default: the built-in sample's (STEPML_SAMPLE_SIZE, else full), a world's full.",
    ),
    world: str | None = typer.Option(
        None,
        "--world",
        help="A known-truth world (evolve data worlds lists them) or a law file's path: its grid of "
        "configurations and held-out split files instead of the built-in sample.",
    ),
    grid: Literal[GRIDS] = typer.Option(
        GRIDS[0],
        "--grid",
        help="With --world: standard (models x GPUs x TP x knobs x five workloads; splits by-gpu, by-size, "
        "by-knobs) or workloads (each deployment under two resent prompt lists and two long-prompt "
        "workloads; split by-workload).",
    ),
):
    """Write the built-in synthetic sample (hidden oracle + noise), or a known-truth world, in the replay format."""
    if world is None:
        if size is not None and size not in SAMPLE_SIZES:
            raise UserError(
                f"--size {size} is a size of a world's grid; the built-in sample is {' or '.join(SAMPLE_SIZES)}"
            )
        dirs = write_synthetic_sample(out_dir, seed=seed, size=size)
        out.print(f"wrote {len(dirs)} synthetic experiments to {out_dir}")
        return
    law = load_world(world)
    dirs, splits = write_world(law, out_dir, seed=seed, size=size or "full", grid=grid)
    out.print(f"wrote {len(dirs)} experiments of world {law.name} to {out_dir}")
    for name, path in splits.items():
        out.print(f"  split {name}: evolve cv --data {out_dir} --protocol groups:{path}")


@data_app.command("worlds")
def data_worlds():
    """List the known-truth worlds: hidden step-time laws for `evolve data synth --world`."""
    out.print(worlds_table([load_world(name) for name in world_names()]))


@data_app.command("export")
def data_export(
    exp_dir: Path = typer.Option(
        ..., "--blis-trace", help="Experiment directory (replay format) to export as a BLIS trace v2."
    ),
    prefix: Path = typer.Option(
        ..., "--out", help="Output prefix: writes PREFIX.yaml, PREFIX.csv, PREFIX.model/config.json, PREFIX.cmd."
    ),
    blis: Path | None = typer.Option(
        None,
        "--blis",
        help="BLIS checkout for --defaults-filepath/--hardware-config "
        "(default: relative paths, to run from a checkout).",
    ),
    latency_model: str = typer.Option(DEFAULT_LATENCY_MODEL, "--latency-model", help="BLIS --latency-model backend."),
    seed: int = typer.Option(DEFAULT_SEED, "--seed", min=0, help="BLIS --seed (its random token ids)."),
    requests: int | None = typer.Option(None, "--requests", min=1, help="Only the first N requests (quick checks)."),
    output_len: OutputLenOption = SETUP.output_len,
    prompt_reuse: PromptReuseOption = SETUP.prompt_reuse,
):
    """Export one experiment as a BLIS trace v2 and print the `blis replay` command that replays it."""
    exp = export_experiment_dir(
        exp_dir,
        prefix,
        output_len=output_len,
        blis_dir=blis,
        latency_model=latency_model,
        seed=seed,
        requests=requests,
        prompt_reuse=prompt_reuse,
    )
    for note in [
        *exp.notes,
        f"wrote {exp.header}, {exp.data} ({exp.n_requests} requests), {exp.config}, {exp.cmd_file}, {exp.deployment}",
    ]:
        err.print(note, markup=False, highlight=False, soft_wrap=True)
    sys.stdout.write(exp.command + "\n")  # plain: one line, never wrapped


@data_app.command("import")
def data_import(
    src: Path = typer.Argument(
        ...,
        help="The measurements: a BLIS trace header (.yaml), per_request_lifecycle_metrics.json, "
        "or OTLP JSON lines of vLLM spans.",
    ),
    fmt: ImportFormat = typer.Option(..., "--from", help="Format of SRC."),
    out_dir: Path = typer.Option(..., "--out", help="New experiment directory to write (must not exist or be empty)."),
    model: str | None = typer.Option(None, "--model", help="Served model (Hugging Face id)."),
    hardware: str | None = typer.Option(None, "--hardware", help="GPU: H100 or A100-80GB."),
    tp: int | None = typer.Option(None, "--tp", min=1, help="Tensor parallelism."),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", min=1),
    max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens", min=1),
    kv_blocks: int | None = typer.Option(None, "--kv-blocks", min=1, help="GPU KV-cache blocks."),
    block_size: int | None = typer.Option(None, "--block-size", min=1, help="KV-cache block size in tokens."),
    model_config: Path | None = typer.Option(None, "--model-config", help="Hugging Face config.json (architecture)."),
    trace_data: Path | None = typer.Option(None, "--trace-data", help="BLIS trace CSV (default: SRC's stem + .csv)."),
):
    """Import measurements (BLIS trace, inference-perf, vLLM OTel spans) as one experiment."""
    path, measured = import_experiment(
        fmt,
        src,
        out_dir,
        trace_data=trace_data,
        model=model,
        hardware=hardware,
        tp=tp,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_blocks=kv_blocks,
        block_size=block_size,
        model_config=str(model_config) if model_config else None,
    )
    n, failed = len(measured.failed), sum(measured.failed)
    out.print(
        f"wrote {path}: {n} requests ({failed} failed), measured at the {measured.measurement} "
        f"(the replay's arrival is the {'send time' if measured.measurement == 'client' else 'server arrival'})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


@app.command("eval")
def eval_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    data: DataOption = None,
    split: Split = typer.Option(
        "test", "--split", help="Split to score: a temporal window, or all (whole experiments)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    workers: WorkersOption = None,
    output_len: OutputLenOption = SETUP.output_len,
    prompt_reuse: PromptReuseOption = SETUP.prompt_reuse,
    semantics: SemanticsOption = SETUP.semantics,
    objective: ObjectiveOption = SETUP.objective,
    weights: WeightsOption = None,
    skip_bad: SkipBadOption = SETUP.skip_bad,
):
    """Replay every experiment closed-loop with PROGRAM; print observed vs predicted and APE."""
    setup = EvaluationSetup(
        data=data,
        output_len=output_len,
        prompt_reuse=prompt_reuse,
        semantics=semantics,
        objective=objective,
        weights=weights,
        workers=workers,
        skip_bad=skip_bad,
    )
    result = evaluate_program(program, setup, split, say=say)
    everywhere = result.failed_everywhere(skip_bad)  # one line, not a table of failures and loss inf
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


@app.command("fit")
def fit_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    data: DataOption = None,
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
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    workers: WorkersOption = None,
    output_len: OutputLenOption = SETUP.output_len,
    prompt_reuse: PromptReuseOption = SETUP.prompt_reuse,
    semantics: SemanticsOption = SETUP.semantics,
    method: MethodOption = FIT.method,
    objective: ObjectiveOption = SETUP.objective,
    weights: WeightsOption = None,
    cluster: ClusterOption = None,
    remote_workers: RemoteWorkersOption = None,
    skip_bad: SkipBadOption = SETUP.skip_bad,
    physics: PhysicsOption = PHYSICS_MODES[0],
    profile: bool = typer.Option(
        True,
        "--profile/--no-profile",
        help="After the fit, profile each constant (2 closed-loop evaluations each) and print whether the "
        "data decided it, its prior holds it, or a bound does.",
    ),
):
    """Fit PROGRAM's constants on the train split, then score validate and test."""
    setup = EvaluationSetup(
        data=data,
        output_len=output_len,
        prompt_reuse=prompt_reuse,
        semantics=semantics,
        objective=objective,
        weights=weights,
        workers=workers,
        cluster=Cluster.of(cluster, remote_workers),
        skip_bad=skip_bad,
    )
    fitted = fit_program(
        program,
        setup,
        seed=seed,
        scope=scope,
        out=out_path,
        max_evals=max_evals,
        quick=quick,
        restarts=restarts,
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
    out.print(
        f"train loss {r.loss:.3f} (+ {penalty:.3f} from the priors) after {r.evaluations} closed-loop evaluations "
        f"({fitted.config.method}) in {r.seconds:.1f} s; fitted program: {', '.join(map(str, fitted.written))}"
    )


@app.command("cv")
def cv_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    protocol: str = typer.Option(
        ...,
        "--protocol",
        help="lomo (leave one model out), lowo (leave one workload out) or groups:FILE "
        "(YAML: fold name -> experiment names it holds out).",
    ),
    data: DataOption = None,
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
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    workers: WorkersOption = None,
    output_len: OutputLenOption = SETUP.output_len,
    prompt_reuse: PromptReuseOption = SETUP.prompt_reuse,
    semantics: SemanticsOption = SETUP.semantics,
    method: MethodOption = FIT.method,
    objective: ObjectiveOption = SETUP.objective,
    weights: WeightsOption = None,
    cluster: ClusterOption = None,
    remote_workers: RemoteWorkersOption = None,
    skip_bad: SkipBadOption = SETUP.skip_bad,
    physics: PhysicsOption = PHYSICS_MODES[0],
):
    """Cross-validate PROGRAM: per fold, fit on the other experiments' train split, score the held-out ones on all requests."""
    setup = EvaluationSetup(
        data=data,
        output_len=output_len,
        prompt_reuse=prompt_reuse,
        semantics=semantics,
        objective=objective,
        weights=weights,
        workers=workers,
        cluster=Cluster.of(cluster, remote_workers),
        skip_bad=skip_bad,
    )
    done = cross_validate_program(
        program,
        protocol,
        setup,
        seed=seed,
        max_evals=max_evals,
        method=method,
        in_distribution=in_distribution,
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
    out.print(f"CV loss ({done.cv.protocol}): {loss_text(done.cv.loss)}  ({done.config.objective.describe()})")


# the run options that only an LLM reads: refused without --llm rather than silently ignored
LLM_ONLY = ("llm_base_url", "llm_ratio", "llm_timeout", "llm_offline", "budget_usd", "max_llm_calls", "max_llm_tokens")


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    generations: int = typer.Option(
        SEARCH.generations, "--generations", min=0, help="Generations to complete (generation 0 fits the seeds)."
    ),
    seed: int = typer.Option(SEARCH.seed, "--seed", min=0, help="Same seed and data give the same archive (offline)."),
    data: DataOption = None,
    archive_dir: Path | None = typer.Option(
        None, "--archive", help="Archive directory (default: runs/<data>-seed<seed>)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the run in --archive from its last completed generation (a new run if there is none).",
    ),
    llm: str | None = typer.Option(
        None, "--llm", help="litellm model string, e.g. openai/gpt-4o-mini, ollama/qwen2.5-coder."
    ),
    llm_base_url: str | None = typer.Option(
        None, "--llm-base-url", help="OpenAI-compatible server URL (e.g. http://127.0.0.1:8000/v1)."
    ),
    llm_ratio: float = typer.Option(
        SEARCH.llm_ratio,
        "--llm-ratio",
        min=0.0,
        max=1.0,
        help="Share of children asked of the LLM; the rest are symbolic.",
    ),
    budget_usd: float | None = typer.Option(
        None, "--budget-usd", min=0.0, help="Stop LLM calls once this much is spent."
    ),
    max_llm_calls: int | None = typer.Option(None, "--max-llm-calls", min=0, help="Stop LLM calls after this many."),
    max_llm_tokens: int | None = typer.Option(
        None, "--max-llm-tokens", min=0, help="Stop LLM calls after this many tokens."
    ),
    llm_timeout: float = typer.Option(
        LLMSettings.timeout_s, "--llm-timeout", help="Seconds before an LLM call is abandoned (then retried)."
    ),
    llm_offline: bool = typer.Option(
        False, "--llm-offline", help="Replay LLM replies from the cache only; never call out."
    ),
    children: int = typer.Option(SEARCH.children, "--children", min=1, help="Children per generation."),
    quick_evals: int | None = typer.Option(
        SEARCH.quick_evals,
        "--quick-evals",
        min=1,
        help="Screening-fit budget per child (closed-loop evaluations; default by "
        "--fit-method: " + ", ".join(f"{n} {m}" for m, n in QUICK_EVALS.items()) + ").",
    ),
    quick_surrogate: int | None = _surrogate_budget(SEARCH.quick_surrogate, "--quick-surrogate", "A screening fit"),
    full_fit_evals: int | None = typer.Option(
        SEARCH.full_fit_evals,
        "--full-fit-evals",
        min=1,
        help="Full-fit budget for promoted children (default by --fit-method).",
    ),
    fit_method: Method = typer.Option(
        SEARCH.fit_method, "--fit-method", help="How constants are fitted (see evolve fit --method)."
    ),
    objective: ObjectiveOption = SEARCH.objective,
    weights: WeightsOption = None,
    patience: int | None = typer.Option(
        SEARCH.patience,
        "--patience",
        min=1,
        help="Stop once the best validation loss has not improved by more than 0.5% for this many generations.",
    ),
    seed_fit_evals: int | None = typer.Option(
        SEARCH.seed_fit_evals, "--seed-fit-evals", min=1, help="Fit budget for the seeds (default: the standard fit)."
    ),
    full_fit_candidates: int = typer.Option(
        SEARCH.full_fit_candidates,
        "--full-fit-candidates",
        min=1,
        help="A promoted child's fit (trust region): closed-loop judged points per iteration.",
    ),
    full_fit_surrogate: int | None = _surrogate_budget(
        SEARCH.full_fit_surrogate, "--full-fit-surrogate", "A promoted child's fit"
    ),
    linear: Literal["sample", "solve"] = typer.Option(
        SEARCH.linear,
        "--linear",
        help="sample: CMA-ES samples every constant on the surrogate; solve: screening and promoted "
        "fits solve the constants a program is affine in by least squares and sample the others "
        "(faster; lower-quality full fits, docs/HISTORY.md).",
    ),
    max_promotions: int = typer.Option(
        SEARCH.max_promotions, "--max-promotions", min=0, help="Full fits per generation at most."
    ),
    islands: int = typer.Option(
        SEARCH.islands, "--islands", min=1, help="Independent islands with periodic migration of their best."
    ),
    migration_interval: int = typer.Option(
        SEARCH.migration_interval,
        "--migration-interval",
        min=1,
        help="Generations between migrations (with --islands > 1).",
    ),
    seeds: list[Path] | None = typer.Option(
        None,
        "--seeds",
        help="Seed program files, or directories of them, instead of the "
        "shipped seeds/ (repeatable); e.g. a winner saved with `evolve archive show ID --source`.",
    ),
    workers: WorkersOption = None,
    semantics: SemanticsOption = SEARCH.semantics,
    prompt_reuse: PromptReuseOption = SEARCH.prompt_reuse,
    cv: str = typer.Option(
        SEARCH.cv,
        "--cv",
        help="none: a promoted child's validation loss is its loss on the validation "
        "windows; lomo/lowo: its full fit is also the fold fits of leave-one-model-"
        "(workload-)out, and its validation loss is the CV loss; groups:FILE: the folds of a "
        "groups file (YAML: fold name -> experiment names it holds out), as `evolve cv` reads it.",
    ),
    cv_fit_evals: int = typer.Option(
        SEARCH.cv_fit_evals,
        "--cv-fit-evals",
        min=0,
        help="With --cv: closed-loop evaluations of each fold's fit, warm-started from the full fit "
        "(0: independent folds with the full-fit budget each, as evolve cv fits them; about 3x the time).",
    ),
    front_cv: Literal[FRONT_CV_MODES] = typer.Option(
        SEARCH.front_cv,
        "--front-cv",
        help="When the run ends, cross-validate the Pareto front members "
        "with this protocol and store the scores (none: skip).",
    ),
    modulate: float = _operator_share("modulate", OPERATOR_SHAPES["modulate"]),
    switch: float = _operator_share("switch", OPERATOR_SHAPES["switch"]),
    units: Literal["check", "off"] = typer.Option(
        SEARCH.units,
        "--units",
        help="check: reject a seed or child whose step time is not a time "
        "(e.g. microseconds plus a count), rule 'units'; off: no units check.",
    ),
    time_components: Literal[TIME_COMPONENT_MODES] | None = _parent_rule_option("time_components"),
    unexercised: Literal[UNEXERCISED_MODES] | None = _parent_rule_option("unexercised"),
    physics: PhysicsOption = SEARCH.physics,
    engine: Literal[ENGINES] = typer.Option(
        ENGINES[0],
        "--engine",
        help="mapelites: our MAP-Elites loop; openevolve: OpenEvolve's controller "
        "(needs --llm) over our evaluator, every program in the same archive.",
    ),
    rewrites: bool = typer.Option(
        False,
        "--rewrites",
        help="With --engine openevolve: ask the LLM for whole programs, not SEARCH/REPLACE "
        "diffs (OpenEvolve's default).",
    ),
    cluster: ClusterOption = None,
    remote_workers: RemoteWorkersOption = None,
    skip_bad: SkipBadOption = SETUP.skip_bad,
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as JSON."),
):
    """Search for step-time programs: MAP-Elites over seeds, symbolic and LLM mutations."""
    require_with(ctx, "--llm MODEL", llm is not None, *LLM_ONLY)
    setup = EvaluationSetup(
        data=data,
        prompt_reuse=prompt_reuse,
        semantics=semantics,
        objective=objective,
        weights=weights,
        workers=workers,
        cluster=Cluster.of(cluster, remote_workers),
        skip_bad=skip_bad,
    )
    config = SearchConfig(
        generations=generations,
        seed=seed,
        children=children,
        islands=islands,
        llm_ratio=llm_ratio,
        quick_evals=quick_evals,
        quick_surrogate=quick_surrogate or None,
        full_fit_evals=full_fit_evals,
        seed_fit_evals=seed_fit_evals,
        full_fit_candidates=full_fit_candidates,
        full_fit_surrogate=full_fit_surrogate or None,
        linear=linear,
        max_promotions=max_promotions,
        migration_interval=migration_interval,
        semantics=semantics,
        prompt_reuse=prompt_reuse,
        fit_method=fit_method,
        objective=objective,
        patience=patience,
        units=units,
        cv=cv,
        cv_fit_evals=cv_fit_evals,
        front_cv=front_cv,
        modulate=modulate,
        switch=switch,
        time_components=engine_rule(engine, "time_components", time_components),
        unexercised=engine_rule(engine, "unexercised", unexercised),
        physics=physics,
    )
    llm_settings = (
        LLMSettings(
            llm,
            base_url=llm_base_url,
            timeout_s=llm_timeout,
            offline=llm_offline,
            max_calls=max_llm_calls,
            max_tokens=max_llm_tokens,
            max_usd=budget_usd,
        )
        if llm
        else None
    )
    outcome = run_search(
        config,
        setup,
        archive_dir,
        resume=resume,
        seeds=seeds,
        llm=llm_settings,
        engine=engine,
        diffs=not rewrites,
        say=say,
        progress=run_progress,
    )
    if as_json:
        print(dumps(outcome.to_json()))
        return
    for item in run_summary_tables(outcome.summary):
        out.print(item)
    if outcome.summary.get("best"):
        out.print(f"archive: {outcome.archive_dir}  (browse: evolve archive list --archive {outcome.archive_dir})")


@app.command("emit-go")
def emit_go_cmd(
    program: str = typer.Argument(
        DEFAULT_RULE,
        help="A deployment rule, a program id from the archive, or a program file (.py). The rules rank "
        "by CV loss (lomo, else lowo) when the archive has CV scores, else by validation loss: tethered "
        "(the default: the lowest loss among programs whose step times stay within --within % over 1x "
        "(default 50: 1.5x) of their seed's on 95 % of the floor's envelope, else the best seed), best "
        "(the lowest loss), simplest (lowest complexity within --within % of best), lineage (best's "
        "nearest ancestor each of whose steps gained more than --within %), anchored (best, unless it "
        "beats the best seed's validation loss by at most --within %: then that seed), penalized (the "
        "lowest loss plus its constants' distance from their priors).",
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
        "(default 50: 1.5x).",
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
):
    """Emit a program as Go (package latency) implementing BLIS's LatencyModel (or install it with --blis)."""
    if blis is None and (backend or go_test):
        raise BlisError("--backend and --go-test go with --blis")
    if blis is not None and (out_path or test_out):
        raise BlisError("--out and --test-out do not go with --blis (it writes sim/latency/<backend>.go and its test)")
    if blis is not None:
        if within is not None:
            raise BlisError("--within does not go with --blis yet (simplest there uses 5%); emit with --out instead")
        install_into_blis(
            program, archive_dir, blis, target, name, backend or DEFAULT_BACKEND, samples, go_test or DEFAULT_GO_TEST
        )
        return
    out_path = out_path or Path("stepml_evolved.go")
    choice = emit_program(
        program, archive_dir, out_path, test_out, target=target, name=name, samples=samples, within=within
    )
    if choice is not None:
        err.print(choice.describe(), markup=False, highlight=False, soft_wrap=True)
    out.print(f"wrote {out_path} ({name}Model, target {target})")
    if test_out:
        out.print(f"wrote {test_out} ({samples} sample batches checked against Python)")


@app.command("blis-compare")
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
):
    """Replay experiments with the program in BLIS and in the tool (BLIS semantics): per-request agreement, means, seconds."""
    from stepml_evolve.evaluator.experiments import experiment_dirs
    from stepml_evolve.evolve.blis.compare import compare_program_in_blis

    dirs = [d for d in experiment_dirs(data) if not experiment or d.name in experiment]
    if not dirs:
        raise BlisError(f"{data}: no experiment directories{' named ' + ', '.join(experiment) if experiment else ''}")
    rows = compare_program_in_blis(
        program, archive_dir, blis, dirs, backend=backend, requests=requests, say=say, prompt_reuse=prompt_reuse
    )
    if as_json:
        print(dumps([r.to_json() for r in rows]))
        return
    out.print(blis_comparison_table(rows))


@app.command("bench")
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
        "--seed-fit-evals",
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
        False, "--quick", help="With --worlds: two worlds, small grids, one split, a few generations (minutes)."
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
    held_out_fits: int = typer.Option(
        1,
        "--held-out-fits",
        min=1,
        help="With --worlds: fit each program this many times (fit seeds --seed, --seed + 1, ...) and "
        "score one of them held out (--held-out-pick): one fit's held-out loss depends on where it ended.",
    ),
    held_out_pick: str = typer.Option(
        "train",
        "--held-out-pick",
        help="With --worlds and several fits: score the fit with the lowest train loss (train: a "
        "multi-start fit, the held-out data never chooses) or the median held-out loss (median, the "
        "rule of benchmarks started before this option).",
    ),
    bench_modulate: float = _operator_share("modulate", "with --worlds, for every search, as for evolve run"),
    bench_switch: float = _operator_share("switch", "with --worlds, for every search, as for evolve run"),
    bench_time_components: Literal[TIME_COMPONENT_MODES] | None = _parent_rule_option(
        "time_components", "With --worlds, for every search, as for evolve run. "
    ),
    bench_unexercised: Literal[UNEXERCISED_MODES] | None = _parent_rule_option(
        "unexercised", "With --worlds, for every search, as for evolve run. "
    ),
    bench_physics: PhysicsOption = SEARCH.physics,
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
    resume: bool = typer.Option(
        False,
        "--resume",
        help="With --worlds: continue the benchmark in --out (same settings; a larger --generations "
        "extends every search), keeping what it finished.",
    ),
):
    """Throughput figures: replay, full evaluation, quick fit, each seed's full fit by each method, search generations per hour."""
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
            engine=search_engine,
            llm=LLMSettings(llm, base_url=llm_base_url) if llm else None,
            fits=held_out_fits,
            pick=held_out_pick,
            modulate=bench_modulate,
            switch=bench_switch,
            time_components=bench_time_components,
            unexercised=bench_unexercised,
            physics=bench_physics,
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
    )
    if as_json:
        print(dumps(figures))
    else:
        for k, v in figures.items():
            if k != "fits":
                out.print(f"{k:24s} {v}")
        for row in figures.get("fits") or []:
            out.print(
                f"fit {row['seed']:18s} {row['method']:13s} {row['fit_s']:8.1f} s {row['replays']:6d} replays  "
                f"train loss {row['train_loss']}"
            )


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
