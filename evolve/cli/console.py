"""The terminal side of every command: stdout and stderr consoles, what a backend says (`say`),
and the one place a user error becomes `error: <message>` with exit code 2 (`CommandGroup`, the
class of every typer app here, so it holds for `main()` and for `CliRunner().invoke(app, ...)` alike)."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evolve.commands import SKIPPED

# wide when piped, so tables are not squeezed into 80 columns
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def error(message: str) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)


def say(message: str) -> None:
    """A line a command's backend tells the user while it works (stderr); one about an input left
    out (`skipped: ...`) shows that word in yellow."""
    if message.startswith(SKIPPED):
        err.print(f"[yellow]skipped:[/yellow] {escape(message.removeprefix(SKIPPED))}", highlight=False, soft_wrap=True)
    else:
        err.print(message, highlight=False)


class CommandGroup(typer.core.TyperGroup):
    """A command group whose commands' user errors print as one `error:` line and exit 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as e:
            error(str(e))
            raise typer.Exit(e.exit_code) from None
