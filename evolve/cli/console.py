"""The terminal side of every command: stdout and stderr consoles, what a backend says (`say`),
and the one place a user error becomes `error: <message>` with exit code 2 (`CommandGroup`, the
class of every typer app here, so it holds for `main()` and for `CliRunner().invoke(app, ...)` alike)."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from stepml_evolve.evaluator.errors import UserError, printable
from stepml_evolve.evolve.commands import SKIPPED, Terminated

# wide when piped, so tables are not squeezed into 80 columns
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def plain(text: str, newlines: bool = False) -> str:
    """User-supplied text for a rich cell, title or line: printable, and never read as markup."""
    return escape(printable(str(text), newlines))


def error(message: str) -> None:
    err.print(f"[red]error:[/red] {plain(message, newlines=True)}", highlight=False, soft_wrap=True)


def say(message: str) -> None:
    """A line a command's backend tells the user while it works (stderr); one about an input left
    out (`skipped: ...`) shows that word in yellow."""
    if message.startswith(SKIPPED):
        err.print(
            f"[yellow]skipped:[/yellow] {plain(message.removeprefix(SKIPPED), newlines=True)}",
            highlight=False,
            soft_wrap=True,
        )
    else:
        err.print(
            printable(message, newlines=True), highlight=False, soft_wrap=True
        )  # one line, never cut at 200 columns


class CommandGroup(typer.core.TyperGroup):
    """A command group whose commands' user errors print as one `error:` line and exit 2, and
    which ends on SIGTERM (`Terminated`, raised by `main`'s handler) as on Ctrl-C, with the
    conventional code: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as e:
            for line in e.details:
                error(line)
            error(str(e))
            raise typer.Exit(e.exit_code) from None
        except Terminated as e:
            raise typer.Exit(128 + e.signum) from None
