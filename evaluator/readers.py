"""Reading a user's file with one-line errors that name it, and bounds on what is read: every file
a command reads goes through `read_text` (a regular file, at most `limit` bytes, checked before
reading: a device, FIFO or 100 GB file is refused, never read until memory runs out or forever),
and every JSON or YAML document is at most JSON_DEPTH levels deep (checked while parsing and after:
a requests.json nested 200,000 deep is one line, never a RecursionError) and holds no integer of
more than INT_DIGITS digits (one line, never Python's ValueError about int_max_str_digits). What a
reader then finds of the wrong type it says in one line naming the file and the field, quoting
the value through `errors.shown` (bounded, whatever the value).

Errors are raised as the caller's UserError subclass (`error`, called with the one-line message);
`FileProblem` is the message without the file's name, for a caller that names the file its own way
(an experiment names its files by their name inside the experiment).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepml_evolve.evaluator.errors import UserError, cut

DATA_BYTES = 1 << 30  # requests.json, ground_truth.json, imported measurements: ~30 times the largest real run's
CONFIG_BYTES = 8 << 20  # profile.json, weights and groups files, a model's config.json, a trace header, a deployment
JSON_DEPTH = 64  # nesting levels of a JSON or YAML document (the replay format needs 4)
INT_DIGITS = 4300  # the longest integer of a document (Python's own limit on reading one in decimal)
_TOO_LONG = 10**INT_DIGITS

ErrorFactory = Callable[[str], UserError]


class FileProblem(Exception):
    """What is wrong with a file (one line, without the file's name)."""


def size_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_checked(path: str | Path, limit: int) -> int:
    """A descriptor of `path` opened for reading if it is a regular file of at most `limit` bytes;
    FileProblem otherwise (nothing is read, and a FIFO is never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens without waiting for a writer
    except FileNotFoundError:
        raise FileProblem("no such file") from None
    except OSError as e:
        raise FileProblem(f"unreadable ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem(f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise FileProblem(f"is {size_text(st.st_size)}, over the {size_text(limit)} limit for this file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_text(path: str | Path, limit: int):
    """`path` opened as UTF-8 text (universal newlines off, as csv wants), once it passed the
    checks of `file_bytes`; for a reader that streams a large file. FileProblem otherwise."""
    return open(_open_checked(path, limit), encoding="utf-8", newline="")


def file_bytes(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; FileProblem otherwise. The size is
    checked before reading, and the read stops past the limit (a file that grows meanwhile)."""
    fd = _open_checked(path, limit)
    try:
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 24, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise FileProblem(f"grew over the {size_text(limit)} limit for this file while being read")
        return b"".join(chunks)
    except OSError as e:
        raise FileProblem(f"unreadable ({e.strerror or e})") from None
    finally:
        os.close(fd)


def file_text(path: str | Path, limit: int) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; FileProblem otherwise."""
    try:
        return file_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileProblem(f"not UTF-8 text (byte {e.start})") from None


def check_depth(document: Any, limit: int = JSON_DEPTH) -> None:
    """FileProblem if `document` nests lists and mappings deeper than `limit`, or holds an integer
    (a value or a key) of more than INT_DIGITS digits (YAML reads 0x... of any length; no field
    of any file is such a number, and Python could not print it in a message). Walked without
    recursion; a container met twice, as YAML aliases make, is walked once."""
    stack, seen = [(document, 1)], set()
    while stack:
        node, depth = stack.pop()
        if isinstance(node, int) and not isinstance(node, bool) and abs(node) >= _TOO_LONG:
            raise FileProblem(f"holds an integer of more than {INT_DIGITS} digits")
        if not isinstance(node, (dict, list, tuple)) or id(node) in seen:
            continue
        if depth > limit:
            raise FileProblem(f"nested deeper than {limit} levels")
        seen.add(id(node))
        items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        stack.extend((x, depth + 1) for x in items if isinstance(x, (dict, list, tuple, int)))


def parse_json(text: str) -> Any:
    """The JSON document in `text`, at most JSON_DEPTH deep; FileProblem otherwise."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise FileProblem(f"malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError:  # json reads integers with int(), which refuses more than INT_DIGITS digits
        raise FileProblem(f"holds an integer of more than {INT_DIGITS} digits") from None
    except RecursionError:
        raise FileProblem(f"nested deeper than {JSON_DEPTH} levels") from None
    check_depth(document)
    return document


def parse_yaml(text: str) -> Any:
    """The YAML document in `text` (safe loader), at most JSON_DEPTH deep; FileProblem otherwise."""
    import yaml

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FileProblem(f"not valid YAML ({cut((str(e).splitlines() or [type(e).__name__])[0])})") from None
    except (ValueError, OverflowError, TypeError, AttributeError, IndexError, KeyError) as e:
        # a constructor's: a decimal integer past INT_DIGITS, a date past 9999, a tag its value does not fit
        too_long = isinstance(e, ValueError) and "integer string conversion" in str(e)
        raise FileProblem(
            f"holds an integer of more than {INT_DIGITS} digits"
            if too_long
            else f"not valid YAML ({cut(str(e).splitlines()[0] if str(e) else type(e).__name__)})"
        ) from None
    except RecursionError:
        raise FileProblem(f"nested deeper than {JSON_DEPTH} levels") from None
    check_depth(document)
    return document


def _named(path: Path, error: ErrorFactory, what: str, problem: FileProblem) -> UserError:
    message = str(problem)
    if message == "no such file" and what != "file":
        message = f"no such {what}"
    return error(f"{path}: {message}")


def read_text(path: str | Path, error: ErrorFactory, what: str = "file", limit: int = CONFIG_BYTES) -> str:
    """The text of `path` (see file_text); `what` names the file in the message for a missing one."""
    p = Path(path)
    try:
        return file_text(p, limit)
    except FileProblem as e:
        raise _named(p, error, what, e) from None


def read_json(path: str | Path, error: ErrorFactory, what: str = "file", limit: int = DATA_BYTES) -> Any:
    """The parsed content of `path`; `what` names the file in the message for a missing one."""
    p = Path(path)
    try:
        return parse_json(file_text(p, limit))
    except FileProblem as e:
        raise _named(p, error, what, e) from None


def read_yaml(path: str | Path, error: ErrorFactory, what: str = "file", limit: int = CONFIG_BYTES) -> Any:
    """The parsed content of a YAML file (safe loader); `what` names the file in messages."""
    p = Path(path)
    try:
        text = file_text(p, limit)
    except FileProblem as e:
        raise error(f"{p}: cannot read the {what} ({e})") from None
    try:
        return parse_yaml(text)
    except FileProblem as e:
        raise error(f"{p}: {e}") from None
