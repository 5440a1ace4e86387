"""SQLite store of a search: runs, programs, evaluations, rejections, LLM calls, generations,
and the cross-validation scores of programs (`cv_scores`, `cv_evaluations`; schema 2) and where their
error grows (`explanations`; schema 3).

Everything a generation produces is written in one transaction together with its
`generations` row, so a killed run (SIGKILL included) leaves the archive at the end of its
last completed generation: resuming redoes the interrupted generation from scratch, and
because a generation is a deterministic function of (seed, generation, archive state), the
redone generation is the one that would have been written.

Guards, all here: every query goes through `_Connection`, so a database error of any kind (a
damaged page, a file that is not a database, a read-only file) is one `ArchiveError` naming the
file; one writer at a time (an flock on `archive.lock` and on the archive's directory, so that
a replaced lock file loses nothing, which the kernel drops when its holder dies, however it
dies); a write stops if the file was deleted or replaced under the writer; an archive in a
directory SQLite cannot write its -shm file into (read-only media) is browsed `immutable`.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.outputs import ARCHIVE_DATABASE, ARCHIVE_LOCK
from stepml_evolve.evaluator.scoring.metrics import MetricRow

from .records import (
    CVEvaluationRecord,
    CVScoreRecord,
    EvaluationRecord,
    ExplanationRecord,
    GenerationRecord,
    LLMCallRecord,
    NewProgram,
    ProgramRecord,
    RejectionRecord,
    RunRecord,
    ddl,
    encode,
    insert,
    select,
)

SCHEMA_VERSION = 3

TABLES: tuple[tuple[str, type, str], ...] = (  # table, record, table constraints
    ("runs", RunRecord, ""),
    ("programs", ProgramRecord, ""),
    ("evaluations", EvaluationRecord, "PRIMARY KEY (program_id, experiment, split)"),
    ("rejections", RejectionRecord, ""),
    ("llm_calls", LLMCallRecord, ""),
    ("generations", GenerationRecord, "PRIMARY KEY (run_id, generation)"),
    # schema 2: cross-validation scores, one per program and protocol, and their held-out experiments
    ("cv_scores", CVScoreRecord, "PRIMARY KEY (program_id, protocol)"),
    ("cv_evaluations", CVEvaluationRecord, "PRIMARY KEY (program_id, protocol, experiment)"),
    # schema 3: where a program's error grows, and the terms screened on its residuals
    ("explanations", ExplanationRecord, "PRIMARY KEY (program_id, split)"),
)


def _add_cv_tables(db: sqlite3.Connection) -> None:
    """1 -> 2: the cross-validation tables, as schema 2 declared them (frozen here: a later schema
    changes them by its own migration); an archive of schema 1 has no CV scores."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS cv_scores (program_id INTEGER NOT NULL REFERENCES programs(id), "
        "protocol TEXT NOT NULL, loss REAL, e2e_mean REAL, e2e_median REAL, e2e_max REAL, ttft_mean REAL, "
        "ttft_median REAL, ttft_max REAL, itl_mean REAL, itl_median REAL, itl_max REAL, seed INTEGER NOT NULL, "
        "max_evals INTEGER, method TEXT NOT NULL, objective TEXT NOT NULL, weights TEXT NOT NULL, "
        "semantics TEXT NOT NULL, folds TEXT NOT NULL, evaluations INTEGER NOT NULL, seconds REAL NOT NULL, "
        "created REAL NOT NULL, PRIMARY KEY (program_id, protocol));"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS cv_evaluations (program_id INTEGER NOT NULL REFERENCES programs(id), "
        "experiment TEXT NOT NULL, split TEXT NOT NULL, n_requests INTEGER NOT NULL, "
        "observed TEXT NOT NULL, predicted TEXT NOT NULL, ape_e2e REAL, ape_ttft REAL, ape_itl REAL, "
        "timeouts_observed INTEGER, timeouts_predicted INTEGER, extra TEXT, protocol TEXT NOT NULL, "
        "fold TEXT NOT NULL, PRIMARY KEY (program_id, protocol, experiment));"
    )


def _add_explanations(db: sqlite3.Connection) -> None:
    """2 -> 3: the explanations table, as schema 3 declared it; an archive of schema 2 has none."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS explanations (program_id INTEGER NOT NULL REFERENCES programs(id), "
        "split TEXT NOT NULL, requests INTEGER NOT NULL, associations TEXT NOT NULL, screening TEXT NOT NULL, "
        "created REAL NOT NULL, PRIMARY KEY (program_id, split));"
    )


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at `path` (device, inode), None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


# MIGRATIONS[v] upgrades an archive from schema v to v + 1 in place (inside one transaction).
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _add_cv_tables, 2: _add_explanations}
SCHEMA = "\n".join(
    ["CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"]
    + [ddl(record, table, constraints) for table, record, constraints in TABLES]
    + ["CREATE INDEX IF NOT EXISTS programs_hash ON programs(run_id, source_hash);"]
)


class ArchiveError(UserError):
    """An archive file that cannot be used; the message is one line naming the file."""


# SQLite's error names for a write that failed (not a read): a full disk, a file over its size limit
WRITE_FAILURES = frozenset(
    {
        "SQLITE_FULL",
        "SQLITE_IOERR_WRITE",
        "SQLITE_IOERR_FSYNC",
        "SQLITE_IOERR_DIR_FSYNC",
        "SQLITE_IOERR_TRUNCATE",
        "SQLITE_IOERR_SHMSIZE",
    }
)


def _problem(e: sqlite3.Error) -> str:
    """What a database error means for the user (SQLite's words in parentheses)."""
    text = str(e)
    if "readonly" in text or "read-only" in text:
        return f"the archive cannot be written ({text}); browsing works, a run or `archive cv` needs a writable copy"
    if "locked" in text or "busy" in text:
        return f"the archive is held by another process ({text})"
    if "full" in text or getattr(e, "sqlite_errorname", None) in WRITE_FAILURES:
        return f"a write to the archive failed ({text}: the disk is full, or the file is over its size limit)"
    return f"not a readable archive ({text})"


def _translated(path: Path, e: sqlite3.Error) -> BaseException:
    """A database error as the user sees it; misuse of the API (ProgrammingError) is a bug and stays as it is."""
    if isinstance(e, sqlite3.ProgrammingError) or not isinstance(e, sqlite3.DatabaseError):
        return e
    return ArchiveError(f"{path}: {_problem(e)}")


class _Cursor(sqlite3.Cursor):
    """A cursor whose database errors, when a statement runs or when rows are fetched, are ArchiveErrors."""

    def _call(self, method, *args):
        try:
            return method(*args)
        except sqlite3.Error as e:
            raise _translated(self.connection.archive_path, e) from None

    def execute(self, *args):
        return self._call(super().execute, *args)

    def executemany(self, *args):
        return self._call(super().executemany, *args)

    def executescript(self, *args):
        return self._call(super().executescript, *args)

    def fetchone(self):
        return self._call(super().fetchone)

    def fetchmany(self, *args):
        return self._call(super().fetchmany, *args)

    def fetchall(self):
        return self._call(super().fetchall)

    def __next__(self):
        return self._call(super().__next__)


class _Connection(sqlite3.Connection):
    """The archive's connection: every statement runs on a `_Cursor`."""

    archive_path: Path

    def cursor(self, factory=_Cursor):
        return super().cursor(factory)

    def execute(self, *args):
        return self.cursor().execute(*args)

    def executemany(self, *args):
        return self.cursor().executemany(*args)

    def executescript(self, *args):
        return self.cursor().executescript(*args)


def _connect(path: Path, target: str | Path, **kwargs) -> _Connection:
    """A connection to the archive file `path` (opened as `target`: the path, or a URI)."""
    try:
        db = sqlite3.connect(target, factory=_Connection, timeout=30, **kwargs)
    except sqlite3.Error as e:
        raise _translated(path, e) from None
    db.archive_path = path
    return db


def _connect_read_only(path: Path) -> _Connection:
    """Read without writing anything. SQLite reads a WAL database through its -shm file, which it
    must create when it is not there: in a directory it cannot write (read-only media, an
    immutable copy) the archive is opened `immutable` instead, which is exact when nothing writes
    it, as nothing can there, and when no -wal file holds changes not yet in the database."""
    uri = path.resolve().as_uri()
    shm, wal = path.with_name(path.name + "-shm"), path.with_name(path.name + "-wal")
    if os.access(path.parent, os.W_OK | os.X_OK) or shm.exists():
        return _connect(path, f"{uri}?mode=ro", uri=True)
    if wal.exists() and wal.stat().st_size > 0:
        raise ArchiveError(
            f"{path}: its directory is read-only and {wal.name} holds changes not yet in the database; "
            "copy the archive (with its -wal file) to a writable directory to browse it"
        )
    return _connect(path, f"{uri}?immutable=1", uri=True)


def _check_not_empty(path: Path) -> None:
    if path.is_file() and path.stat().st_size == 0:
        raise ArchiveError(
            f"{path}: an empty file (0 bytes), not an archive; restore the archive, or remove the file to start anew"
        )


def _check_writable(path: Path) -> None:
    """The real reason a writer cannot write the archive, before SQLite says "readonly database"."""
    directory = path.parent
    if path.exists() and not os.access(path, os.W_OK):
        raise ArchiveError(
            f"{path}: the archive is read-only (the file cannot be written); browsing works, "
            "a run or `archive cv` needs a writable copy"
        )
    if directory.is_dir() and not os.access(directory, os.W_OK | os.X_OK):
        raise ArchiveError(
            f"{path}: the archive's directory {directory} is read-only (SQLite writes its -wal and -shm "
            "files there); browsing works, a run or `archive cv` needs a writable copy"
        )


class WriterLock:
    """One writer per archive: an exclusive flock on <archive>/archive.lock, held while the
    archive is open for writing. The kernel drops it when the holder's file is closed or the
    holder dies (SIGKILL included), so it is never left stuck; the file holds the holder's pid.

    The lock is held on the archive's directory too, so it cannot be lost with its file: a
    lock file replaced or deleted under a writer (an output written over it) is a new file a
    second writer could lock, but the directory is the same one, and the second writer is refused.
    A file system that cannot lock a directory keeps the lock file alone."""

    FILE = ARCHIVE_LOCK

    def __init__(self, directory: Path):
        path = directory / self.FILE
        try:
            self.fh = open(path, "a+")
        except OSError as e:
            raise ArchiveError(f"{path}: cannot take the archive's writer lock ({e.strerror})") from None
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                self.fh.close()
                raise ArchiveError(f"{path}: cannot take the archive's writer lock ({e.strerror})") from None
            self.fh.seek(0)
            pid = self.fh.read().strip()
            self.fh.close()
            self._refuse(directory, f"process {pid}" if pid.isdigit() else "another process")
        self.directory_fd = self._lock_directory(directory)
        self.fh.truncate(0)
        self.fh.write(f"{os.getpid()}\n")
        self.fh.flush()

    def _lock_directory(self, directory: Path) -> int | None:
        try:
            fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                self.fh.close()
                self._refuse(directory, f"another process (which holds the directory; {self.FILE} was replaced)")
            return None  # no directory locks here (e.g. NFS): the lock file alone
        return fd

    @staticmethod
    def _refuse(directory: Path, holder: str):
        raise ArchiveError(
            f"{directory}: {holder} is writing this archive (one writer at a time); wait for it to end, "
            "or write to another --archive (browsing works meanwhile)"
        ) from None

    def release(self) -> None:
        self.fh.close()  # closing the file drops the lock
        if self.directory_fd is not None:
            os.close(self.directory_fd)
            self.directory_fd = None

    def __del__(self):
        # An archive dropped without close(): the garbage collector closes the lock file by
        # itself but not the directory's descriptor, which would keep the archive locked for
        # the rest of the process.
        if getattr(self, "directory_fd", None) is not None:
            self.release()


class Archive:
    FILE = ARCHIVE_DATABASE

    @classmethod
    def open(cls, directory: str | Path, writable: bool = False) -> Archive:
        """An existing archive: read-only (browsing never writes, even to a run in progress) or
        writable (which migrates an older schema in place). No archive there, or one that cannot
        be read: a one-line ArchiveError naming the file."""
        directory = Path(directory)
        path = directory / cls.FILE
        if not path.is_file():
            raise ArchiveError(f"{directory}: no archive here ({cls.FILE} not found)")
        return cls(directory, read_only=not writable)

    def __init__(self, directory: str | Path, create: bool = False, read_only: bool = False):
        """Open (or with create=True, make) the archive in `directory`. read_only opens the
        database without writing anything, so browsing never waits on a running search.
        Writing takes the archive's writer lock (one writer at a time) and checks the file with
        `PRAGMA quick_check` first (a damaged archive is refused before anything is added to it).
        An archive of another schema version is migrated (read-write) or refused (one line)."""
        self.dir = Path(directory)
        self.migrated_from: int | None = None  # the schema version this open migrated the archive from, if it did
        self.lock: WriterLock | None = None
        self.identity: tuple[int, int] | None = None  # the file a writer opened (device, inode)
        path = self.path = self.dir / self.FILE
        if not path.exists() and not create:
            raise FileNotFoundError(f"{path}: no archive here")
        if read_only or not create:
            _check_not_empty(path)
        if read_only:
            self.db = _connect_read_only(path)
            try:
                self.db.execute("SELECT 1 FROM programs LIMIT 1")  # fails early on a file that is not an archive
                self._check_version(path, migrate=False)
            except ArchiveError:
                self.db.close()
                raise
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ArchiveError(f"{self.dir}: cannot make the archive's directory ({e.strerror})") from None
        _check_writable(path)
        self.lock = WriterLock(self.dir)
        try:
            self._open_for_writing(path)
        except BaseException:
            self.lock.release()
            raise
        self.identity = _identity(path)  # what `transaction` checks is still there

    def _open_for_writing(self, path: Path) -> None:
        self.db = _connect(path, path, isolation_level=None)
        try:
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "meta" not in tables:  # never take over someone else's database
                raise ArchiveError(
                    f"{path}: a SQLite database that is not a stepml-evolve archive "
                    f"(tables: {', '.join(sorted(tables))}); choose another --archive"
                )
            if tables:
                self._quick_check(path)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            if tables:
                self._check_version(path, migrate=True)
            self.db.executescript(SCHEMA)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except ArchiveError:
            self.db.close()
            raise

    def _quick_check(self, path: Path) -> None:
        """SQLite's structural check of every page (seconds for a large archive, once per writer)."""
        problems = [r[0] for r in self.db.execute("PRAGMA quick_check(1)")]
        if problems != ["ok"]:
            lines = [ln.strip() for ln in problems[0].splitlines() if ln.strip() and not ln.startswith("***")]
            raise ArchiveError(
                f"{path}: not a readable archive (damaged: {lines[0] if lines else 'quick_check failed'}); "
                "restore it from a copy"
            )

    def _check_version(self, path: Path, migrate: bool) -> None:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        try:
            version = int(row[0]) if row else None
        except ValueError:
            version = None
        if version is None:
            raise ArchiveError(
                f"{path}: the archive records no schema version; it is damaged or not a stepml-evolve archive"
            )
        if version > SCHEMA_VERSION:
            raise ArchiveError(
                f"{path}: archive schema {version} is newer than this stepml-evolve reads "
                f"({SCHEMA_VERSION}); upgrade stepml-evolve to open it"
            )
        if version == SCHEMA_VERSION:
            return
        missing = [v for v in range(version, SCHEMA_VERSION) if v not in MIGRATIONS]
        if missing:
            raise ArchiveError(
                f"{path}: archive schema {version} is too old for this stepml-evolve "
                f"(reads {SCHEMA_VERSION}; no migration from {missing[0]})"
            )
        if not migrate:
            raise ArchiveError(
                f"{path}: archive schema {version} is older than this stepml-evolve reads "
                f"({SCHEMA_VERSION}); `evolve archive migrate --archive {path.parent}` upgrades it in place"
            )
        with self.transaction() as db:
            for v in range(version, SCHEMA_VERSION):
                MIGRATIONS[v](db)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        self.migrated_from = version

    def schema_version(self) -> int:
        return int(self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])

    def close(self) -> None:
        self.db.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def check_still_there(self) -> None:
        """A writer stops when its archive was deleted or replaced: writing on would go to a file
        that no longer has a name, and the work would be lost without a word."""
        now = _identity(self.path)
        if self.identity is not None and now != self.identity:
            what = "deleted" if now is None else "replaced by another file"
            raise ArchiveError(
                f"{self.path}: the archive was {what} while this command was writing it; "
                "stopped (nothing more is written)"
            )

    @contextmanager
    def transaction(self):
        self.check_still_there()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")

    # ---- runs ----
    def create_run(self, data_label: str, fingerprint: str, synthetic: bool, seed: int, config: dict) -> int:
        with self.transaction() as db:
            return insert(
                db,
                "runs",
                RunRecord(
                    id=None,
                    created=time.time(),
                    data_label=data_label,
                    data_fingerprint=fingerprint,
                    synthetic=synthetic,
                    seed=seed,
                    config=config,
                ),
            )

    def run(self, run_id: int | None = None) -> RunRecord | None:
        """The run `run_id`, or the latest run; None if there is none."""
        if run_id:
            rows = select(self.db, RunRecord, "runs", "id=?", (run_id,))
        else:
            rows = select(self.db, RunRecord, "runs", order="id DESC LIMIT 1")
        return rows[0] if rows else None

    def set_summary(self, run_id: int, summary: dict) -> None:
        with self.transaction() as db:
            db.execute("UPDATE runs SET summary=? WHERE id=?", (encode(RunRecord, "summary", summary), run_id))

    def last_generation(self, run_id: int) -> int:
        row = self.db.execute("SELECT MAX(generation) FROM generations WHERE run_id=?", (run_id,)).fetchone()
        return -1 if row[0] is None else int(row[0])

    def generations(self, run_id: int) -> list[GenerationRecord]:
        return select(self.db, GenerationRecord, "generations", "run_id=?", (run_id,), order="generation")

    # ---- programs ----
    def programs(self, run_id: int | None = None, where: str = "", args: tuple = ()) -> list[ProgramRecord]:
        clauses = ["run_id=?"] if run_id is not None else []
        params: tuple = (run_id,) if run_id is not None else ()
        if where:
            clauses.append(where)
            params += args
        return select(self.db, ProgramRecord, "programs", " AND ".join(clauses), params, order="id")

    def program(self, program_id: int) -> ProgramRecord | None:
        rows = select(self.db, ProgramRecord, "programs", "id=?", (program_id,))
        return rows[0] if rows else None

    def evaluations(self, program_id: int) -> list[EvaluationRecord]:
        return select(
            self.db, EvaluationRecord, "evaluations", "program_id=?", (program_id,), order="split, experiment"
        )

    def metric_rows(self, program_id: int, split: str | None = None) -> list[MetricRow]:
        """The program's per-experiment rows (of one split, or all), by split then experiment."""
        return [e.metric_row() for e in self.evaluations(program_id) if split is None or e.split == split]

    def rejections(self, run_id: int) -> list[RejectionRecord]:
        return select(self.db, RejectionRecord, "rejections", "run_id=?", (run_id,), order="id")

    def llm_calls(self, run_id: int) -> list[LLMCallRecord]:
        return select(self.db, LLMCallRecord, "llm_calls", "run_id=?", (run_id,), order="id")

    # ---- cross-validation scores ----
    def write_cv(self, program_id: int, cv, config, semantics: str, seconds: float = 0.0) -> CVScoreRecord:
        """Store `cv` (an evaluator.crossval.CrossValidation of program `program_id`, fitted with the
        FitConfig `config` and replayed with `semantics`), replacing any earlier score of its protocol."""
        score = CVScoreRecord.of(program_id, cv, config, semantics, seconds, created=time.time())
        rows = [CVEvaluationRecord.of(program_id, cv.protocol, f.fold.name, r) for f in cv.folds for r in f.rows]
        self.write_cv_record(score, rows)
        return score

    def write_cv_record(self, score: CVScoreRecord, rows: list[CVEvaluationRecord] = ()) -> None:
        """Store one CV score and its held-out rows in one transaction, replacing the program's
        earlier score of the same protocol (and its rows)."""
        if self.program(score.program_id) is None:
            raise ArchiveError(f"{self.dir}: program {score.program_id} does not exist; no CV score stored")
        with self.transaction() as db:
            for table in ("cv_scores", "cv_evaluations"):
                db.execute(f"DELETE FROM {table} WHERE program_id=? AND protocol=?", (score.program_id, score.protocol))
            insert(db, "cv_scores", score)
            for r in rows:
                insert(
                    db, "cv_evaluations", dataclasses.replace(r, program_id=score.program_id, protocol=score.protocol)
                )

    def write_explanation(self, explanation: ExplanationRecord) -> None:
        """Store a program's explanation on a split, replacing an earlier one."""
        if self.program(explanation.program_id) is None:
            raise ArchiveError(f"{self.dir}: program {explanation.program_id} does not exist; no explanation stored")
        with self.transaction() as db:
            db.execute(
                "DELETE FROM explanations WHERE program_id=? AND split=?", (explanation.program_id, explanation.split)
            )
            insert(db, "explanations", explanation)

    def explanations(self, run_id: int | None = None) -> list[ExplanationRecord]:
        """The stored explanations (of a run's programs), by program and split."""
        if run_id is None:
            return select(self.db, ExplanationRecord, "explanations", order="program_id, split")
        where = "program_id IN (SELECT id FROM programs WHERE run_id=?)"
        return select(self.db, ExplanationRecord, "explanations", where, (run_id,), order="program_id, split")

    def cv_scores(self, program_id: int | None = None, run_id: int | None = None) -> list[CVScoreRecord]:
        """CV scores of one program, of a run's programs, or all; by program, then protocol."""
        if program_id is not None:
            return select(
                self.db, CVScoreRecord, "cv_scores", "program_id=?", (program_id,), order="program_id, protocol"
            )
        if run_id is not None:
            return select(
                self.db,
                CVScoreRecord,
                "cv_scores",
                "program_id IN (SELECT id FROM programs WHERE run_id=?)",
                (run_id,),
                order="program_id, protocol",
            )
        return select(self.db, CVScoreRecord, "cv_scores", order="program_id, protocol")

    def cv_evaluations(self, program_id: int, protocol: str | None = None) -> list[CVEvaluationRecord]:
        """The held-out experiments of a program's CV scores (one protocol, or all), by protocol, fold, experiment."""
        where, args = (
            ("program_id=? AND protocol=?", (program_id, protocol)) if protocol else ("program_id=?", (program_id,))
        )
        return select(self.db, CVEvaluationRecord, "cv_evaluations", where, args, order="protocol, fold, experiment")

    # ---- writing one generation ----
    def write_generation(
        self,
        run_id: int,
        generation: int,
        seconds: float,
        programs: list[NewProgram],
        rejections: list[RejectionRecord],
        llm_calls: list[LLMCallRecord],
        stats: GenerationRecord,
    ) -> list[int]:
        """Write a whole generation atomically; returns the new program ids in order.

        Records get their run and generation here; an LLM call names its program by
        `program_index` (its place in `programs`). `stats` gets run, generation and timing."""
        ids: list[int] = []
        with self.transaction() as db:
            for p in programs:
                pid = insert(
                    db, "programs", dataclasses.replace(p.record, id=None, run_id=run_id, generation=generation)
                )
                ids.append(pid)
                for row in p.evaluations:
                    insert(db, "evaluations", EvaluationRecord.of(pid, row))
                if p.cv is not None:
                    insert(db, "cv_scores", dataclasses.replace(p.cv, program_id=pid))
                    for r in p.cv_rows:
                        insert(db, "cv_evaluations", dataclasses.replace(r, program_id=pid))
            for rj in rejections:
                insert(db, "rejections", dataclasses.replace(rj, id=None, run_id=run_id, generation=generation))
            for c in llm_calls:
                pid = ids[c.program_index] if c.program_index is not None else None
                insert(
                    db,
                    "llm_calls",
                    dataclasses.replace(c, id=None, run_id=run_id, generation=generation, program_id=pid),
                )
            insert(
                db,
                "generations",
                dataclasses.replace(
                    stats, run_id=run_id, generation=generation, completed=time.time(), seconds=seconds
                ),
            )
        return ids
