"""The `evolve` command line: each command parses its options, calls one library function and
prints the result. User errors (`UserError`) are reported once, by `console.CommandGroup`."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal, Optional

import typer

from evaluator.datasets import OUTPUT_LEN_POLICIES, SYNTHETIC_SEED, check_data, write_synthetic_sample
from evaluator.experiments import SPLITS
from evaluator.fitting import SCOPES, FitConfig

from .archive_cli import archive_app
from .bench import run_bench
from .console import CommandGroup, Log, err, error, out
from .emission import emit_program
from .emit_go import DEFAULT_NAME, INTERFACES
from .fitting_job import fit_program
from .go_parity import DEFAULT_SAMPLES
from .runs import LLMSettings, run_search
from .scoring import evaluate_program
from .search import SearchConfig
from .tables import dumps, experiments_table, loss_text, metrics_table, run_summary_tables

app = typer.Typer(cls=CommandGroup, add_completion=False, no_args_is_help=True,
                  help="Discover step-time programs for LLM-inference simulators.")
data_app = typer.Typer(cls=CommandGroup, no_args_is_help=True, help="Inspect and generate experiment data.")
app.add_typer(data_app, name="data")
app.add_typer(archive_app, name="archive")

SEARCH, FIT = SearchConfig(), FitConfig()
Split = Literal[SPLITS]
Scope = Literal[SCOPES]
OutputLen = Literal[OUTPUT_LEN_POLICIES]
Interface = Literal[INTERFACES]

DataOpt = typer.Option(None, "--data", help="Directory of replay experiments (default: the built-in synthetic sample).")
WorkersOpt = typer.Option(None, "--workers", min=1, help="Parallel replay threads (default: all cores).")
OutputLenOpt = typer.Option(OUTPUT_LEN_POLICIES[0], "--output-len",
                            help="Output length policy: profile (server output_len) or reported (client token counts).")


@data_app.command("check")
def data_check(
    data: Optional[Path] = DataOpt,
    output_len: OutputLen = OutputLenOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """Validate experiments and summarize each: model, TP, requests, observed means, split sizes."""
    check = check_data(data, output_len)
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
):
    """Write the built-in synthetic sample (hidden oracle + noise) in the replay format."""
    dirs = write_synthetic_sample(out_dir, seed=seed)
    out.print(f"wrote {len(dirs)} synthetic experiments to {out_dir}")


@app.command("eval")
def eval_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    data: Optional[Path] = DataOpt,
    split: Split = typer.Option("test", "--split", help="Split to score."),
    as_json: bool = typer.Option(False, "--json"),
    workers: Optional[int] = WorkersOpt,
    output_len: OutputLen = OutputLenOpt,
):
    """Replay every experiment closed-loop with PROGRAM; print observed vs predicted and APE."""
    result = evaluate_program(program, data, split, workers, output_len, Log())
    if as_json:
        print(dumps(result.to_json()))
    else:
        out.print(metrics_table(result.rows, f"{program} on {result.data.label}, {split} split"))
        out.print(f"loss ({split}): {loss_text(result.loss)}  (RMS APE mean E2E + RMS APE mean TTFT, %)")
    for r in result.failed:
        error(f"{program} on {r.name}: {r.error}")
    if result.failed:
        raise typer.Exit(2)


@app.command("fit")
def fit_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    data: Optional[Path] = DataOpt,
    seed: int = typer.Option(FIT.seed, "--seed", min=0, help="CMA-ES seed: same seed and data give the same constants."),
    scope: Scope = typer.Option(FIT.scope, "--scope", help="One constant set (global), one per model, or one per experiment."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Fitted program file (default: <program>.fitted.py here)."),
    max_evals: Optional[int] = typer.Option(FIT.max_evals, "--max-evals", min=1, help="CMA-ES evaluation budget per group."),
    quick: bool = typer.Option(False, "--quick", help="Screening fit: subset of experiments, short window, small budget."),
    restarts: int = typer.Option(FIT.restarts, "--restarts", min=0,
                                 help="Extra CMA-ES runs from the best point so far (each with the full budget)."),
    as_json: bool = typer.Option(False, "--json"),
    workers: Optional[int] = WorkersOpt,
    output_len: OutputLen = OutputLenOpt,
):
    """Fit PROGRAM's constants with CMA-ES on the train split, then score validate and test."""
    fitted = fit_program(program, data, seed=seed, scope=scope, out=out_path, max_evals=max_evals, quick=quick,
                         restarts=restarts, workers=workers, output_len=output_len, log=Log())
    if as_json:
        print(dumps(fitted.to_json()))
        return
    for split, rows in fitted.rows.items():
        out.print(metrics_table(rows, f"fitted {program.name} ({scope} scope), {split} split"))
        out.print(f"loss ({split}): {loss_text(fitted.losses[split])}")
    r = fitted.result
    out.print(f"train loss {r.loss:.3f} after {r.evaluations} evaluations in {r.seconds:.1f} s; "
              f"fitted program: {', '.join(map(str, fitted.written))}")


@app.command("run")
def run_cmd(
    generations: int = typer.Option(SEARCH.generations, "--generations", min=0,
                                    help="Generations to complete (generation 0 fits the seeds)."),
    seed: int = typer.Option(SEARCH.seed, "--seed", min=0, help="Same seed and data give the same archive (offline)."),
    data: Optional[Path] = DataOpt,
    archive_dir: Optional[Path] = typer.Option(None, "--archive", help="Archive directory (default: runs/<data>-seed<seed>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --archive from its last completed generation "
                                "(a new run if there is none)."),
    llm: Optional[str] = typer.Option(None, "--llm", help="litellm model string, e.g. openai/gpt-4o-mini, ollama/qwen2.5-coder."),
    llm_base_url: Optional[str] = typer.Option(None, "--llm-base-url",
                                               help="OpenAI-compatible server URL (e.g. http://127.0.0.1:8000/v1)."),
    llm_ratio: float = typer.Option(SEARCH.llm_ratio, "--llm-ratio", min=0.0, max=1.0,
                                    help="Share of children asked of the LLM; the rest are symbolic."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", min=0.0, help="Stop LLM calls once this much is spent."),
    max_llm_calls: Optional[int] = typer.Option(None, "--max-llm-calls", min=0, help="Stop LLM calls after this many."),
    max_llm_tokens: Optional[int] = typer.Option(None, "--max-llm-tokens", min=0, help="Stop LLM calls after this many tokens."),
    llm_timeout: float = typer.Option(LLMSettings.timeout_s, "--llm-timeout",
                                      help="Seconds before an LLM call is abandoned (then retried)."),
    llm_offline: bool = typer.Option(False, "--llm-offline", help="Replay LLM replies from the cache only; never call out."),
    children: int = typer.Option(SEARCH.children, "--children", min=1, help="Children per generation."),
    quick_evals: int = typer.Option(SEARCH.quick_evals, "--quick-evals", min=1,
                                    help="Screening-fit budget per child (CMA-ES evaluations)."),
    full_fit_evals: int = typer.Option(SEARCH.full_fit_evals, "--full-fit-evals", min=1,
                                       help="Full-fit budget for promoted children."),
    seed_fit_evals: Optional[int] = typer.Option(SEARCH.seed_fit_evals, "--seed-fit-evals", min=1,
                                                 help="Fit budget for the seeds (default: the standard fit)."),
    max_promotions: int = typer.Option(SEARCH.max_promotions, "--max-promotions", min=0, help="Full fits per generation at most."),
    islands: int = typer.Option(SEARCH.islands, "--islands", min=1, help="Independent islands with periodic migration of their best."),
    migration_interval: int = typer.Option(SEARCH.migration_interval, "--migration-interval", min=1,
                                           help="Generations between migrations (with --islands > 1)."),
    seeds: Optional[list[Path]] = typer.Option(None, "--seeds", help="Seed program files, or directories of them, instead of the "
                                               "shipped seeds/ (repeatable); e.g. a winner saved with `evolve archive show ID --source`."),
    workers: Optional[int] = WorkersOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as JSON."),
):
    """Search for step-time programs: MAP-Elites over seeds, symbolic and LLM mutations."""
    config = SearchConfig(generations=generations, seed=seed, children=children, islands=islands, llm_ratio=llm_ratio,
                          quick_evals=quick_evals, full_fit_evals=full_fit_evals, seed_fit_evals=seed_fit_evals,
                          max_promotions=max_promotions, migration_interval=migration_interval)
    llm_settings = LLMSettings(llm, base_url=llm_base_url, timeout_s=llm_timeout, offline=llm_offline, max_calls=max_llm_calls,
                               max_tokens=max_llm_tokens, max_usd=budget_usd) if llm else None
    outcome = run_search(config, data, archive_dir, resume=resume, seeds=seeds, llm=llm_settings, workers=workers, log=Log())
    if as_json:
        print(dumps(outcome.to_json()))
        return
    for item in run_summary_tables(outcome.summary):
        out.print(item)
    if outcome.summary.get("best"):
        out.print(f"archive: {outcome.archive_dir}  (browse: evolve archive list --archive {outcome.archive_dir})")


@app.command("emit-go")
def emit_go_cmd(
    program: str = typer.Argument("best", help="best, a program id from the archive, or a program file (.py)."),
    archive_dir: Optional[Path] = typer.Option(None, "--archive", help="Archive directory (default: the newest under runs/)."),
    out_path: Path = typer.Option(Path("stepml_evolved.go"), "--out", help="Go file to write."),
    test_out: Optional[Path] = typer.Option(None, "--test-out", help="Also write a Go test checking Go against Python."),
    interface: Interface = typer.Option(INTERFACES[0], "--interface",
                                        help="v5 (5-method LatencyModel) or v4 (PostDecodeFixedOverhead)."),
    name: str = typer.Option(DEFAULT_NAME, "--name", help="Go identifier prefix: <name>Model, New<name>Model, ..."),
    samples: int = typer.Option(DEFAULT_SAMPLES, "--samples", min=1, help="Sample batches in the generated test."),
):
    """Emit a program as Go (package latency) implementing the simulator's LatencyModel."""
    emit_program(program, archive_dir, out_path, test_out, interface=interface, name=name, samples=samples)
    out.print(f"wrote {out_path} ({name}Model, interface {interface})")
    if test_out:
        out.print(f"wrote {test_out} ({samples} sample batches checked against Python)")


@app.command("bench")
def bench_cmd(
    data: Optional[Path] = typer.Option(None, "--data", help="Replay data (default: ../shared/data/replay if present, else synthetic)."),
    as_json: bool = typer.Option(False, "--json"),
    skip_fit: bool = typer.Option(False, "--skip-fit", help="Skip the (minutes-long) full fit figure."),
    search_generations: int = typer.Option(4, "--search-generations", min=0, help="Generations timed for generations_per_hour (0 skips)."),
    workers: Optional[int] = WorkersOpt,
):
    """Throughput figures: replay, full evaluation, full and quick fits, search generations per hour."""
    figures = run_bench(data, skip_fit=skip_fit, log=Log().note, search_generations=search_generations, workers=workers)
    if as_json:
        print(dumps(figures))
    else:
        for k, v in figures.items():
            out.print(f"{k:24s} {v}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
