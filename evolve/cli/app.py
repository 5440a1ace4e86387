"""The `evolve` command line: each command parses its options, calls one library function and
prints the result (the commands are in data_commands.py, program_commands.py, run_command.py,
bench_command.py and archive_commands.py). User errors (`UserError`) are reported once, by
`console.CommandGroup`. A command imports its backend (and with it numba, pycma, the replay) in its
body: `--help` and usage errors read only the options, made from light modules, and answer at once."""

from __future__ import annotations

import signal
import sys

import typer

from stepml_evolve.evolve.commands import Terminated

from .archive_commands import archive_app
from .bench_command import bench_cmd
from .console import CommandGroup, err
from .data_commands import data_app
from .memory import keep_freed_memory
from .program_commands import blis_compare_cmd, cv_cmd, emit_go_cmd, eval_cmd, explain_cmd, fit_cmd
from .run_command import run_cmd

app = typer.Typer(
    cls=CommandGroup,
    add_completion=False,
    no_args_is_help=True,
    help="Discover step-time programs for LLM-inference simulators.",
)
app.add_typer(data_app, name="data")
app.add_typer(archive_app, name="archive")
for name, command in (
    ("eval", eval_cmd),
    ("fit", fit_cmd),
    ("cv", cv_cmd),
    ("explain", explain_cmd),
    ("run", run_cmd),
    ("emit-go", emit_go_cmd),
    ("blis-compare", blis_compare_cmd),
    ("bench", bench_cmd),
):
    app.command(name)(command)


def _terminate(signum, frame) -> None:
    raise Terminated(signum, signal.Signals(signum).name)


def main() -> None:
    keep_freed_memory()
    signal.signal(signal.SIGTERM, _terminate)  # ends a command as Ctrl-C does (CommandGroup: exit 143)
    try:
        app()
    except KeyboardInterrupt as e:
        err.print("interrupted")
        sys.exit(128 + e.signum if isinstance(e, Terminated) else 130)
