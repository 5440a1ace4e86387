"""The command line: the typer app (app.py, registering data_commands.py, program_commands.py,
run_command.py, bench_command.py and archive_commands.py; options.py for the options several
commands share, settings_options.py for those made from settings fields) and what it prints with
(console, tables, progress). Commands parse, call one backend in `evolve.commands` with the `say`
and progress displays of this package, and print."""

from .app import app, main

__all__ = ["app", "main"]
