"""Files the commands write: named, checked before any work is done, written atomically, never
over an input (an archive's directory, every file of it, is an input of every command). A bad
output path is a one-line error, not a traceback after minutes of fitting. A command that writes
a directory writes it whole or not at all (`directory_written_whole`)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stepml_evolve.evaluator.errors import UserError


class OutputError(UserError, ValueError):
    """An output path that cannot or must not be written; the message names it."""


def slug(text: str, keep_org: bool = False) -> str:
    """A file-name-safe form of a model id or directory name; keep_org keeps "org/" so that two orgs' models differ."""
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text if keep_org else text.split("/")[-1]).strip("-").lower()


def per_group_paths(base: Path, groups: list[str]) -> dict[str, Path]:
    """One file per group: `base` itself for a single group, else base.<group slug>.py (the org is
    kept in the slug when two orgs' models share a name)."""
    slugs = {g: slug(g) for g in groups}
    if len(set(slugs.values())) < len(slugs):  # e.g. orgA/Foo and orgB/Foo
        slugs = {g: slug(g, keep_org=True) for g in groups}
    if len(groups) == 1:
        return {groups[0]: base}
    return {g: base.with_name(f"{base.stem}.{slugs[g]}{base.suffix or '.py'}") for g in groups}


SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")
# What a search archive's directory holds, whatever the content: the database (archive.store's
# Archive.FILE) and its side files, the writer's lock (WriterLock.FILE), the LLM reply cache
# (evolve run's llm_cache/) and OpenEvolve's own files (evolve/openevolve's OUTPUT_DIR).
ARCHIVE_DATABASE = "archive.sqlite"
ARCHIVE_LOCK = "archive.lock"
ARCHIVE_OWNED = (
    ARCHIVE_DATABASE,
    *(ARCHIVE_DATABASE + s for s in SQLITE_SIDE_FILES),
    ARCHIVE_LOCK,
    "llm_cache",
    "openevolve",
)


def check_outputs(outputs: list[Path], inputs: list[Path] = ()) -> None:
    """The one rule for every file a command writes, checked before any work starts: an output is
    a new name or a regular file, in an existing writable directory; it is none of the command's
    inputs, no other output, no SQLite database (an archive) or one of its side files, and no file
    an archive's directory owns (ARCHIVE_OWNED: its lock, its caches), whatever that file holds."""
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
        if out.exists() and not out.is_file():
            raise OutputError(f"{out}: is not a regular file (a device, pipe or socket); give a file name")
        _check_writable_dir(out, out.parent)
        if _is_database(resolved):
            raise OutputError(f"{out}: is a SQLite database (an archive's?); choose another output file")
        _check_not_archive_owned(out, resolved)


def check_output_dir(out: Path) -> None:
    """The same rule for a command that writes a directory of files: a new name in an existing
    writable directory, or an existing empty directory it can write into."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputError(f"{out}: exists and is not an empty directory; give a new directory (nothing written)")
    _check_writable_dir(out, out if out.is_dir() else out.parent)
    _check_not_archive_owned(out, out.resolve())


def _check_not_archive_owned(out: Path, resolved: Path) -> None:
    """An output is none of the files an archive's directory owns (ARCHIVE_OWNED), nor inside one
    of its folders: the directory is an archive's when it holds its database or its lock."""
    for directory in resolved.parents:
        if not any((directory / name).exists() for name in (ARCHIVE_DATABASE, ARCHIVE_LOCK)):
            continue
        owned = resolved.relative_to(directory).parts[0]
        if owned in ARCHIVE_OWNED:
            raise OutputError(f"{out}: belongs to the archive in {directory} ({owned}); choose another output file")


def _check_writable_dir(out: Path, directory: Path) -> None:
    """`directory`, where `out` is written, exists and can be written (os.access: for root too, it
    says no on a read-only file system or an immutable directory)."""
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"{out}: {directory} is not a directory")
    if not directory.is_dir():
        raise OutputError(f"{out}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputError(f"{out}: directory {directory} is not writable")


def _is_database(path: Path) -> bool:
    """A SQLite database, or a side file (-wal, -shm, -journal) beside one."""
    for suffix in SQLITE_SIDE_FILES:
        if path.name.endswith(suffix) and _is_database(path.with_name(path.name[: -len(suffix)])):
            return True
    try:
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:  # a new name, or unreadable: nothing to protect that we could recognise
        return False


def write_atomic(path: Path, text: str, fsync: bool = False) -> None:
    """Write through a temporary file and rename: a crash never leaves half a file. fsync makes
    the content durable before the rename (for caches that a killed run must find intact)."""
    path = Path(path)
    try:
        _write_through_temporary(path, text, fsync)
    except OSError as e:  # the disk filled, or the directory changed since it was checked: one line
        raise OutputError(f"{path}: cannot write ({e.strerror or e}); nothing written") from None


def _write_through_temporary(path: Path, text: str, fsync: bool) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        # surrogateescape: a path the file system's encoding could not decode (LC_ALL=C) is written
        # back as the bytes it came from, never a UnicodeEncodeError after the work is done
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def directory_written_whole(out: Path) -> Iterator[Path]:
    """A temporary directory beside `out` (a new name or an empty directory, as check_output_dir
    allows) to write into; renamed to `out` when the block ends, removed when it raises (a full
    disk, a failed check), so `out` is written whole or not at all and a rerun is not refused."""
    out = Path(out)
    try:
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    except OSError as e:
        raise OutputError(f"{out}: cannot write ({e.strerror or e}); nothing written") from None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; give the directory the mode mkdir would
        if out.is_dir():
            out.rmdir()  # empty (check_output_dir)
        os.rename(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):  # named as the file would have been named in `out`
            where = str(e.filename).replace(str(tmp), str(out), 1) if e.filename else out
            raise OutputError(f"{where}: cannot write ({e.strerror or e}); nothing written") from None
        raise
