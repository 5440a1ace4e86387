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


def experiment_summary(e) -> dict:
    return {
        "name": e.name, "model": e.model, "tp": e.tp, "moe": e.arch.moe, "hardware": e.hardware.name,
        "n_requests": e.n_requests, "n_failed": e.n_failed,
        "output_len": e.output_len_used if e.output_len_used is not None else "reported",
        "observed": e.observed_means(), "split": e.split_sizes(), "synthetic": e.synthetic,
        "notes": e.notes,
    }


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
