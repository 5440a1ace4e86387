"""ast.parse under one process-wide lock.

CPython before 3.12.1 keeps the AST converter's recursion depth in module state that every
thread shares (python/cpython#106905). Two threads parsing at once (the search fits children
concurrently, and a fit may parse a program) can interleave when a garbage collection runs
Python code mid-conversion, and the parse then fails with
`SystemError: AST constructor recursion depth mismatch`. Every parse in the project goes
through `parse_python`, so no two run at once."""

from __future__ import annotations

import ast
import threading
import warnings

_LOCK = threading.Lock()


def parse_python(source: str, mode: str = "exec", *, quiet: bool = False) -> ast.AST:
    """ast.parse(source, mode=mode), one thread at a time. quiet: no SyntaxWarning or
    DeprecationWarning from odd literals (warning filters are process state too, so they are
    swapped under the same lock)."""
    with _LOCK:
        if not quiet:
            return ast.parse(source, mode=mode)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)  # e.g. an invalid escape in a string literal
            return ast.parse(source, mode=mode)
