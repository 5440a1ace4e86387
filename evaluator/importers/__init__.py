"""Measurements in other tools' formats as one experiment in the replay layout
(`evolve data import --from FORMAT SRC --out DIR`). Each reader turns a source into `Measured`
requests; `common` resolves the deployment and writes the experiment."""

from __future__ import annotations

from pathlib import Path

from stepml_evolve.evaluator.importers.blis_trace import read_blis_trace
from stepml_evolve.evaluator.importers.common import (
    DataImportError,
    Measured,
    check_out_dir,
    resolve_deployment,
    write_measured,
)
from stepml_evolve.evaluator.importers.inference_perf import read_inference_perf
from stepml_evolve.evaluator.importers.otel import read_otel

FORMATS = ("blis-trace", "inference-perf", "otel")


def import_experiment(
    fmt: str, src: str | Path, out: str | Path, *, trace_data: str | Path | None = None, **flags
) -> tuple[Path, Measured]:
    """Read SRC in format `fmt` and write one experiment at `out`; flags: model, hardware, tp,
    max_num_seqs, max_num_batched_tokens, kv_blocks, block_size, model_config (None = not given).
    Raises DataImportError (one line naming the file and row, or the list of missing fields)."""
    src, out = Path(src), Path(out)
    if fmt not in FORMATS:
        raise DataImportError(f"--from {fmt}: unknown format (known: {', '.join(FORMATS)})")
    if trace_data is not None and fmt != "blis-trace":
        raise DataImportError("--trace-data: only for --from blis-trace")
    check_out_dir(out)
    if not src.is_file():
        raise DataImportError(f"{src}: no such file")
    if fmt == "blis-trace":
        measured = read_blis_trace(src, trace_data)
    elif fmt == "inference-perf":
        measured = read_inference_perf(src)
    else:
        measured = read_otel(src)
    deployment, model_config = resolve_deployment(
        src, {k: v for k, v in flags.items() if v is not None}, measured.recorded
    )
    return write_measured(measured, out, deployment, model_config), measured


__all__ = ["FORMATS", "DataImportError", "Measured", "import_experiment"]
