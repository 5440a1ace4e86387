"""The command line: the typer app (app.py, archive.py for `evolve archive ...`, options.py for the
options several commands share) and what it prints with (console, tables, progress). Commands
parse, call one backend in `evolve.commands` with the `say` and progress displays of this package,
and print."""

from .app import app, main

__all__ = ["app", "main"]
