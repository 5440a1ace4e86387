"""The one base class of every error a user can cause (bad data, program, archive, path, option).

Its message is one line naming the file, flag or program and the problem. The command line
catches `UserError` once, at its top (`evolve.console.CommandGroup`, the class of every typer app), prints `error: <detail>` for
each of its `details`, then `error: <message>`, and exits 2;
anything else reaching the top is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; str(error) is one line naming where and what."""

    exit_code = 2
    details: tuple[str, ...] = ()  # lines said before the message, each one line (e.g. one per bad experiment)
