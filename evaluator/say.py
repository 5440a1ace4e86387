"""How a backend speaks to its user: one line at a time, through a `say` callable it is given (the
command line prints and colours it; the Python API and the tests pass their own, or `quiet`)."""

from collections.abc import Callable

Say = Callable[[str], None]  # one line to the user
SKIPPED = "skipped: "  # how a line about an input left out begins (the command line shows the word in yellow)


def quiet(message: str) -> None:
    """A `say` that tells no one."""
