"""Files the commands write: checked before any work is done, written atomically, never over
an input. A bad output path is a one-line error, not a traceback after minutes of fitting."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from evaluator.errors import UserError


class OutputError(UserError, ValueError):
    """An output path that cannot or must not be written; the message names it."""


def check_outputs(outputs: list[Path], inputs: list[Path] = ()) -> None:
    """Every output writable (its directory exists, it is not a directory), distinct from the
    others and from every input file."""
    seen: dict[Path, Path] = {}
    protected = {Path(p).resolve() for p in inputs}
    for out in outputs:
        out = Path(out)
        resolved = out.resolve()
        if resolved in protected:
            raise OutputError(f"{out}: is an input of this command; choose another output file")
        if resolved in seen:
            raise OutputError(f"{out}: given for two outputs ({seen[resolved]} and {out})")
        seen[resolved] = out
        if out.is_dir():
            raise OutputError(f"{out}: is a directory; give a file name")
        if not out.parent.is_dir():
            raise OutputError(f"{out}: directory {out.parent} does not exist")


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and rename: a crash never leaves half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
