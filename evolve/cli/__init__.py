"""The command line: the typer app (app.py, archive.py for `evolve archive ...`) and what it prints
with (console, tables, progress). Commands parse, call one backend in `evolve.commands`, print."""
from .app import app, main

__all__ = ["app", "main"]
