"""`evolve data ...`: check experiments, write the synthetic sample or a known-truth world, list the
worlds, export to and import from other formats."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import typer

from stepml_evolve.evaluator.datasets import SYNTHETIC_SEED, check_data, write_synthetic_sample
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.importers import FORMATS as IMPORT_FORMATS
from stepml_evolve.evaluator.importers import import_experiment
from stepml_evolve.evaluator.importers.blis_trace_export import (
    DEFAULT_LATENCY_MODEL,
    DEFAULT_SEED,
    export_experiment_dir,
)
from stepml_evolve.evaluator.known_truth import GRID_SIZES, GRIDS
from stepml_evolve.evaluator.known_truth.synthetic_sample import SAMPLE_SIZES

from .console import CommandGroup, err, error, out
from .options import (
    SETUP,
    DataOption,
    OutputLenOption,
    PromptReuseOption,
)

data_app = typer.Typer(cls=CommandGroup, no_args_is_help=True, help="Inspect and generate experiment data.")

ImportFormat = Literal[IMPORT_FORMATS]


@data_app.command("check")
def data_check(
    data: DataOption = None,
    output_len: OutputLenOption = SETUP.output_len,
    prompt_reuse: PromptReuseOption = SETUP.prompt_reuse,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """Validate experiments and summarize each: model, TP, requests, observed means, split sizes, prompt reuse."""
    from .tables import experiments_table

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
    from stepml_evolve.evaluator.known_truth import load_world, write_world

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
    from stepml_evolve.evaluator.known_truth import load_world, world_names

    from .tables import worlds_table

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
