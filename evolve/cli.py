"""The `evolve` command line: thin wiring from typer commands to the modules that do the work."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Discover step-time programs for LLM-inference simulators.")
data_app = typer.Typer(no_args_is_help=True, help="Inspect and generate experiment data.")
app.add_typer(data_app, name="data")

# wide when piped, so tables are not squeezed into 80 columns
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

DataOpt = typer.Option(None, "--data", help="Directory of replay experiments (default: the built-in synthetic sample).")


def fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _loss_text(x: float) -> str:
    return f"{x:.3f}" if x == x else "n/a (no experiment has a successful request in this split)"


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


@data_app.command("check")
def data_check(
    data: Optional[Path] = DataOpt,
    output_len: str = typer.Option("profile", help="Output length policy: profile (server output_len) or reported."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """Validate experiments and summarize each: model, TP, requests, observed means, split sizes."""
    from evaluator.datasets import load_data

    try:
        loaded = load_data(data, output_len=output_len)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    rows = [experiment_summary(e) for e in loaded.experiments]
    if as_json:
        payload = {"data": loaded.label, "synthetic": loaded.synthetic, "experiments": rows,
                   "errors": [{"name": e.experiment, "error": e.problem} for e in loaded.errors]}
        print(json.dumps(payload, indent=2))
    else:
        table = Table(title=f"experiments in {loaded.label}")
        for col in ("experiment", "model", "TP", "kind", "requests", "failed", "out len", "E2E s", "TTFT s", "train/val/test"):
            table.add_column(col, justify="left" if col in ("experiment", "model") else "right")
        for r in rows:
            s = r["split"]
            table.add_row(r["name"], r["model"].split("/")[-1], str(r["tp"]), "MoE" if r["moe"] else "dense", str(r["n_requests"]),
                          str(r["n_failed"]), str(r["output_len"]), _fmt(r["observed"]["e2e_mean_s"]),
                          _fmt(r["observed"]["ttft_mean_s"], 4), f"{s['train']}/{s['validate']}/{s['test']}")
        out.print(table)
    for e in loaded.errors:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
    if loaded.errors:
        raise typer.Exit(2)


@data_app.command("synth")
def data_synth(
    out_dir: Path = typer.Option(..., "--out", help="Directory to write the synthetic experiments into."),
    seed: int = typer.Option(0, min=0, help="Generator seed (0 is the built-in sample)."),
):
    """Write the built-in synthetic sample (hidden oracle + noise) in the replay format."""
    from evaluator.synthetic import write_sample

    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        fail(f"{out_dir}: exists and is not an empty directory; the sample goes into a new one (nothing written)")
    dirs = write_sample(out_dir, seed=seed)
    out.print(f"wrote {len(dirs)} synthetic experiments to {out_dir}")


def experiment_summary(e) -> dict:
    return {
        "name": e.name, "model": e.model, "tp": e.tp, "moe": e.arch.moe, "hardware": e.hardware.name,
        "n_requests": e.n_requests, "n_failed": e.n_failed,
        "output_len": e.output_len_used if e.output_len_used is not None else "reported",
        "observed": e.observed_means(), "split": e.split_sizes(), "synthetic": e.synthetic,
        "notes": e.notes,
    }


def _load(data: Optional[Path], output_len: str = "profile"):
    from evaluator.datasets import load_data

    try:
        loaded = load_data(data, output_len=output_len)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    for e in loaded.errors:
        err.print(f"[yellow]skipped:[/yellow] {e}", highlight=False, soft_wrap=True)
    if not loaded.experiments:
        fail(f"{loaded.label}: no valid experiments")
    if loaded.synthetic:
        err.print(f"using the built-in synthetic sample: {loaded.label} (pass --data DIR for real experiments)")
    return loaded


def _program(path: Path):
    from evaluator.dsl import ProgramError, load_program

    try:
        return load_program(path)
    except ProgramError as e:
        fail(str(e))


WorkersOpt = typer.Option(None, "--workers", min=1, help="Parallel replay threads (default: all cores).")
SplitChoice = typer.Option("test", "--split", help="Split to score: train, validate or test.")


@app.command("eval")
def eval_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    data: Optional[Path] = DataOpt,
    split: str = SplitChoice,
    as_json: bool = typer.Option(False, "--json"),
    workers: Optional[int] = WorkersOpt,
    output_len: str = typer.Option("profile", help="Output length policy: profile or reported."),
):
    """Replay every experiment closed-loop with PROGRAM; print observed vs predicted and APE."""
    from evaluator.engine import Engine
    from evaluator.experiments import SPLITS
    from evaluator.metrics import loss

    from .tables import dumps, metrics_table

    if split not in SPLITS:
        fail(f"--split must be one of {', '.join(SPLITS)}")
    prog = _program(program)
    loaded = _load(data, output_len)
    consts = [list(prog.constants.values())] * len(loaded.experiments)
    import numpy as np

    with Engine(loaded.experiments, workers) as engine:
        rows = engine.score(prog, [np.array(c, dtype=float) for c in consts], (split,), percentiles=True)[split]
    total = loss(rows)
    if as_json:
        print(dumps({"program": str(program), "data": loaded.label, "synthetic": loaded.synthetic, "split": split,
                     "loss": total, "experiments": rows}))
    else:
        out.print(metrics_table(rows, f"{program} on {loaded.label}, {split} split"))
        out.print(f"loss ({split}): {_loss_text(total)}  (RMS APE mean E2E + RMS APE mean TTFT, %)")
    failed = [r for r in rows if r.error]
    for r in failed:
        err.print(f"[red]error:[/red] {program} on {r.name}: {r.error}", highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(2)


@app.command("fit")
def fit_cmd(
    program: Path = typer.Argument(..., help="Program file in the DSL."),
    data: Optional[Path] = DataOpt,
    seed: int = typer.Option(0, "--seed", min=0, help="CMA-ES seed: same seed and data give the same constants."),
    scope: str = typer.Option("global", "--scope", help="global (one constant set), model, or experiment."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Fitted program file (default: <program>.fitted.py here)."),
    max_evals: Optional[int] = typer.Option(None, "--max-evals", min=1, help="CMA-ES evaluation budget per group."),
    quick: bool = typer.Option(False, "--quick", help="Screening fit: subset of experiments, short window, small budget."),
    restarts: int = typer.Option(0, "--restarts", min=0, help="Extra CMA-ES runs from the best point so far (each with the full budget)."),
    as_json: bool = typer.Option(False, "--json"),
    workers: Optional[int] = WorkersOpt,
    output_len: str = typer.Option("profile", help="Output length policy: profile or reported."),
):
    """Fit PROGRAM's constants with CMA-ES on the train split, then score validate and test."""
    import dataclasses

    from evaluator.engine import Engine
    from evaluator.fitting import FAILED_LOSS, FAILED_REASON, FitConfig, fit, group_key, quick_config
    from evaluator.metrics import loss

    from .outputs import OutputError, check_outputs, write_atomic
    from .progress import fit_progress
    from .tables import dumps, metrics_table

    prog = _program(program)
    loaded = _load(data, output_len)
    try:
        config = quick_config(seed, loaded.experiments) if quick else FitConfig(seed=seed, scope=scope)
        config = dataclasses.replace(config, scope=scope, max_evals=max_evals or config.max_evals, restarts=restarts)
    except ValueError as e:
        fail(str(e))
    base = out_path or Path(f"{program.stem}.fitted.py")
    groups = sorted({group_key(e, scope) for e in loaded.experiments})
    slugs = {g: _slug(g) for g in groups}
    if len(set(slugs.values())) < len(slugs):  # e.g. orgA/Foo and orgB/Foo: keep the org in the name
        slugs = {g: _slug(g, keep_org=True) for g in groups}
    paths = {g: base if len(groups) == 1 else base.with_name(f"{base.stem}.{slugs[g]}{base.suffix or '.py'}") for g in groups}
    try:  # before minutes of fitting, not after
        check_outputs(list(paths.values()), inputs=[program])
    except OutputError as e:
        fail(str(e))
    with Engine(loaded.experiments, workers) as engine, fit_progress(err) as progress:
        result = fit(prog, loaded.experiments, engine, config, progress=progress)
        if not result.loss < FAILED_LOSS:
            fail(f"{program}: {FAILED_REASON}; nothing written")
        vectors = [result.vector_for(prog, e) for e in loaded.experiments]
        rows = engine.score(prog, vectors, ("validate", "test"), percentiles=True)
    written = []
    for group, consts in result.constants.items():
        header = (f"data={loaded.label} seed={seed} scope={scope} group={group}"
                  + (f" restarts={restarts}" if restarts else "") + (" quick" if quick else "")
                  + (f" train_loss={result.loss:.4f}" if len(result.constants) == 1 else f" train_loss_all_groups={result.loss:.4f}")
                  + f" evaluations={result.evaluations}")
        fitted = prog.with_constants(consts, header=header)
        path = paths.get(group, base)
        write_atomic(path, fitted.source)
        written.append(str(path))
    splits = {s: {"loss": loss(rows[s]), "experiments": rows[s]} for s in rows}
    if as_json:
        print(dumps({"program": str(program), "fitted_programs": written, "data": loaded.label, "synthetic": loaded.synthetic,
                     "seed": seed, "scope": scope, "train_loss": result.loss, "constants": result.constants,
                     "evaluations": result.evaluations, "seconds": result.seconds, "splits": splits}))
    else:
        for s in ("validate", "test"):
            out.print(metrics_table(rows[s], f"fitted {program.name} ({scope} scope), {s} split"))
            out.print(f"loss ({s}): {_loss_text(splits[s]['loss'])}")
        out.print(f"train loss {result.loss:.3f} after {result.evaluations} evaluations in {result.seconds:.1f} s; "
                  f"fitted program: {', '.join(written)}")


def _slug(text: str, keep_org: bool = False) -> str:
    """A file-name-safe form of a model id; keep_org keeps "org/" so that two orgs' models differ."""
    import re

    return re.sub(r"[^A-Za-z0-9.-]+", "-", text if keep_org else text.split("/")[-1]).strip("-").lower()


@app.command("run")
def run_cmd(
    generations: int = typer.Option(500, "--generations", min=0, help="Generations to complete (generation 0 fits the seeds)."),
    seed: int = typer.Option(7, "--seed", min=0, help="Same seed and data give the same archive (offline)."),
    data: Optional[Path] = DataOpt,
    archive_dir: Optional[Path] = typer.Option(None, "--archive", help="Archive directory (default: runs/<data>-seed<seed>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --archive from its last completed generation (a new run if there is none)."),
    llm: Optional[str] = typer.Option(None, "--llm", help="litellm model string, e.g. openai/gpt-4o-mini, ollama/qwen2.5-coder."),
    llm_base_url: Optional[str] = typer.Option(None, "--llm-base-url", help="OpenAI-compatible server URL (e.g. http://127.0.0.1:8000/v1)."),
    llm_ratio: float = typer.Option(0.5, "--llm-ratio", min=0.0, max=1.0, help="Share of children asked of the LLM; the rest are symbolic."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", min=0.0, help="Stop LLM calls once this much is spent."),
    max_llm_calls: Optional[int] = typer.Option(None, "--max-llm-calls", min=0, help="Stop LLM calls after this many."),
    max_llm_tokens: Optional[int] = typer.Option(None, "--max-llm-tokens", min=0, help="Stop LLM calls after this many tokens."),
    llm_timeout: float = typer.Option(60.0, "--llm-timeout", help="Seconds before an LLM call is abandoned (then retried)."),
    llm_offline: bool = typer.Option(False, "--llm-offline", help="Replay LLM replies from the cache only; never call out."),
    children: int = typer.Option(6, "--children", min=1, help="Children per generation."),
    quick_evals: int = typer.Option(40, "--quick-evals", min=1, help="Screening-fit budget per child (CMA-ES evaluations)."),
    full_fit_evals: int = typer.Option(96, "--full-fit-evals", min=1, help="Full-fit budget for promoted children."),
    seed_fit_evals: Optional[int] = typer.Option(None, "--seed-fit-evals", min=1, help="Fit budget for the seeds (default: the standard fit)."),
    max_promotions: int = typer.Option(1, "--max-promotions", min=0, help="Full fits per generation at most."),
    islands: int = typer.Option(1, "--islands", min=1, help="Independent islands with periodic migration of their best."),
    migration_interval: int = typer.Option(25, "--migration-interval", min=1, help="Generations between migrations (with --islands > 1)."),
    seeds: Optional[list[Path]] = typer.Option(None, "--seeds", help="Seed program files, or directories of them, instead of the "
                                               "shipped seeds/ (repeatable); e.g. a winner saved with `evolve archive show ID --source`."),
    workers: Optional[int] = WorkersOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as JSON."),
):
    """Search for step-time programs: MAP-Elites over seeds, symbolic and LLM mutations."""
    from archive.store import Archive, ArchiveError
    from evaluator.engine import Engine

    from .emitters import build_emitters
    from .progress import run_progress
    from .search import Search, SearchConfig, SearchError
    from .tables import dumps

    seed_programs = _seed_programs(seeds) if seeds else None  # bad seeds fail before any data is loaded
    if archive_dir is not None and archive_dir.exists() and not archive_dir.is_dir():
        fail(f"{archive_dir}: is a file; --archive takes a directory")
    loaded = _load(data)
    tag = "synthetic" if loaded.synthetic else _slug(Path(loaded.label).name)
    archive_dir = archive_dir or Path("runs") / f"{tag}-seed{seed}"
    if resume and not (archive_dir / Archive.FILE).exists():
        err.print(f"{archive_dir}: no archive yet, starting a new run", highlight=False)
    config = SearchConfig(generations=generations, seed=seed, children=children, islands=islands,
                          llm_ratio=llm_ratio if llm else 0.0, quick_evals=quick_evals, full_fit_evals=full_fit_evals,
                          seed_fit_evals=seed_fit_evals, max_promotions=max_promotions, migration_interval=migration_interval)
    try:
        archive = Archive(archive_dir, create=True)
    except ArchiveError as e:
        fail(str(e))
    operator = None
    if llm:
        from .llm_client import LLMClient
        from .llm_operator import Budget, LLMOperator

        client = LLMClient(llm, archive_dir / "llm_cache", base_url=llm_base_url, timeout_s=llm_timeout, offline=llm_offline)
        s = loaded.experiments[0].server
        operator = LLMOperator(client, Budget(max_calls=max_llm_calls, max_tokens=max_llm_tokens, max_usd=budget_usd),
                               server={"budget_tokens": s.max_num_batched_tokens, "max_seqs": s.max_num_seqs})
    run_config = {"data": loaded.label, "llm": llm, "llm_base_url": llm_base_url}
    with Engine(loaded.experiments, workers) as engine:
        try:
            search = Search(archive, loaded, engine, config, build_emitters(operator, config.llm_ratio), resume=resume,
                            run_config=run_config, seeds=seed_programs)
        except RuntimeError as e:
            fail(str(e))
        start = archive.last_generation(search.run_id) + 1
        if start > generations:
            err.print(f"{archive_dir}: already at generation {start - 1}; nothing to run", highlight=False)
        else:
            err.print(f"archive: {archive_dir}  (generations {start}..{generations})", highlight=False)
        try:
            with run_progress(err, generations, start) as progress:
                search.progress = progress
                summary = search.run()
        except SearchError as e:
            fail(f"{archive_dir}: {e}")
    archive.close()
    if as_json:
        print(dumps({"archive": str(archive_dir), **summary}))
    else:
        _print_summary(archive_dir, summary)


def _seed_programs(paths: list[Path]) -> list[tuple[str, str]]:
    """(name, source) of every seed program under --seeds, each validated; one-line errors otherwise."""
    from evaluator.dsl import ProgramError, parse_program

    files = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
            if not found:
                fail(f"{path}: no seed programs (*.py) in this directory")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            fail(f"{path}: no such seed program file or directory")
    seeds, seen = [], set()
    for f in files:
        if f.stem in seen:
            fail(f"{f}: a second seed named {f.stem!r}; seed names (file stems) must be unique")
        seen.add(f.stem)
        try:
            source = f.read_text()
            parse_program(source)
        except (OSError, UnicodeDecodeError) as e:
            fail(f"{f}: cannot read ({e})")
        except ProgramError as e:
            fail(f"{f}: {e}")
        seeds.append((f.stem, source))
    return seeds


def _print_summary(archive_dir: Path, summary: dict) -> None:
    best = summary.get("best")
    if not best:
        out.print("no program was fully evaluated")
        return
    out.print(f"best program by validation loss: #{best['id']} (generation {best['generation']}, {best['operator']}), "
              f"val loss {best['val_loss']:.3f}, test loss {best['test_loss']:.3f}, complexity {best['complexity']}")
    t = Table(title=f"program #{best['id']}: test split, absolute % error of means")
    for col in ("experiment", "n", "E2E", "TTFT", "ITL"):
        t.add_column(col, justify="left" if col == "experiment" else "right")
    for r in best["test"]:
        a = r["ape"]
        t.add_row(r["name"], str(r["n_requests"]), *("n/a" if a[k] is None else f"{a[k]:.1f}" for k in ("e2e", "ttft", "itl")))
    out.print(t)
    f = Table(title="Pareto front (validation loss vs complexity)")
    for col in ("id", "complexity", "val loss", "operator"):
        f.add_column(col)
    for p in summary["front"]:
        f.add_row(str(p["id"]), str(p["complexity"]), f"{p['val_loss']:.3f}", p["operator"])
    out.print(f)
    out.print(f"archive: {archive_dir}  (browse: evolve archive list --archive {archive_dir})")


@app.command("emit-go")
def emit_go_cmd(
    program: str = typer.Argument("best", help="best, a program id from the archive, or a program file (.py)."),
    archive_dir: Optional[Path] = typer.Option(None, "--archive", help="Archive directory (default: the newest under runs/)."),
    out_path: Path = typer.Option(Path("stepml_evolved.go"), "--out", help="Go file to write."),
    test_out: Optional[Path] = typer.Option(None, "--test-out", help="Also write a Go test checking Go against Python."),
    interface: str = typer.Option("v5", "--interface", help="v5 (5-method LatencyModel) or v4 (PostDecodeFixedOverhead)."),
    name: str = typer.Option("StepMLEvolved", "--name", help="Go identifier prefix: <name>Model, New<name>Model, ..."),
    samples: int = typer.Option(1000, "--samples", min=1, help="Sample batches in the generated test."),
):
    """Emit a program as Go (package latency) implementing the simulator's LatencyModel."""
    from .emit_go import EmitError, emit_go, emit_go_test, gofmt
    from .go_parity import samples as parity_samples

    from .outputs import OutputError, check_outputs, write_atomic

    program_file = Path(program) if program.endswith(".py") else None
    try:
        check_outputs([out_path] + ([test_out] if test_out else []), inputs=[program_file] if program_file else [])
    except OutputError as e:
        fail(str(e))
    prog, header = _program_for_emission(program, archive_dir)
    try:
        source = gofmt(emit_go(prog, name=name, interface=interface, header=header))
        test_source = gofmt(emit_go_test(name, parity_samples(prog, samples), interface)) if test_out else None
    except EmitError as e:
        fail(str(e))
    write_atomic(out_path, source)
    out.print(f"wrote {out_path} ({name}Model, interface {interface})")
    if test_out:
        write_atomic(test_out, test_source)
        out.print(f"wrote {test_out} ({samples} sample batches checked against Python)")


def _program_for_emission(spec: str, archive_dir: Optional[Path]):
    """The program to emit and its header lines: from a file, or from an archive by id/best."""
    from archive.browse import BrowseError, open_archive, resolve
    from evaluator.dsl import parse_program

    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            fail(f"{path}: no such program file")
        prog = _program(path)
        fitted = [ln[len("# fitted: "):] for ln in prog.source.splitlines() if ln.startswith("# fitted: ")]
        return prog, {"program": str(path), **({"fitted": fitted[0]} if fitted else {})}
    try:
        archive = open_archive(archive_dir)
        record = resolve(archive, spec)
        run = archive.run()
    except BrowseError as e:
        fail(str(e))

    def f(x):
        return "n/a" if x is None else f"{x:.4f}"

    header = {"program": f"#{record.id} of {archive.dir} (generation {record.generation}, {record.operator})",
              "data": run.data_label, "seed": run.seed,
              "loss": f"train {f(record.train_loss)}, validation {f(record.val_loss)}, test {f(record.test_loss)}"}
    return parse_program(record.source), header


@app.command("bench")
def bench_cmd(
    data: Optional[Path] = typer.Option(None, "--data", help="Replay data (default: ../shared/data/replay if present, else synthetic)."),
    as_json: bool = typer.Option(False, "--json"),
    skip_fit: bool = typer.Option(False, "--skip-fit", help="Skip the (minutes-long) full fit figure."),
    search_generations: int = typer.Option(4, "--search-generations", min=0, help="Generations timed for generations_per_hour (0 skips)."),
    workers: Optional[int] = WorkersOpt,
):
    """Throughput figures: replay, full evaluation, full and quick fits, search generations per hour."""
    from .bench import run_bench
    from .tables import dumps

    if data is not None and not data.is_dir():
        fail(f"{data}: no such data directory")
    figures = run_bench(data, skip_fit=skip_fit, log=lambda m: err.print(m, highlight=False), search_generations=search_generations, workers=workers)
    if as_json:
        print(dumps(figures))
    else:
        for k, v in figures.items():
            out.print(f"{k:24s} {v}")


from .archive_cli import archive_app  # noqa: E402  (the archive commands use this module's consoles)

app.add_typer(archive_app, name="archive")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
