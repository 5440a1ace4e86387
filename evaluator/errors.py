"""The one base class of every error a user can cause (bad data, program, archive, path, option).

Its message is one line naming the file, flag or program and the problem. The command line
catches `UserError` once, at its top (`evolve.console.CommandGroup`, the class of every typer app), prints `error: <detail>` for
each of its `details`, then `error: <message>`, and exits 2;
anything else reaching the top is a bug and keeps its traceback.

A message that quotes what the user gave (a value, a name, a path, a program's text) quotes it
through `cut` or `shown`, so a 10 MB input makes a line of a few dozen characters, not 10 MB.
"""

from __future__ import annotations

import reprlib

QUOTE_CHARS = 120  # the longest quote of user input a message holds


class UserError(Exception):
    """A problem the user can fix; str(error) is one line naming where and what."""

    exit_code = 2
    details: tuple[str, ...] = ()  # lines said before the message, each one line (e.g. one per bad experiment)


def cut(text: str, limit: int = QUOTE_CHARS) -> str:
    """`text` as a message quotes it: whole when short, else its beginning and its length."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[: max(limit - 30, 10)]}... ({len(text):,} characters)"


def shown(value, limit: int = QUOTE_CHARS) -> str:
    """A value a message quotes (a field of a file): its repr, bounded in length and depth, and
    never an error itself (an integer too long to print in decimal is said by its size)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:  # over 300 digits
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    try:
        return cut(reprlib.repr(value), limit)
    except ValueError:  # an integer too long to print, nested in a container
        return f"a {type(value).__name__} holding an integer too long to print"


def printable(text: str, newlines: bool = False) -> str:
    """Text that may quote the user's names (a directory, a file, a model id) as it goes to a
    terminal: every non-printable character (the ESC of an escape sequence, a carriage return, a
    bell, a bidi override) shown as its Python escape, so a name can never recolour, move the
    cursor or hide itself; with `newlines`, line breaks are kept (a message listing items one a
    line). The one rule for user-supplied text on the terminal."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or (newlines and c == "\n") else c.encode("unicode_escape").decode("ascii") for c in text
    )
