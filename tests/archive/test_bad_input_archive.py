"""Bad input on the archive side (issue 27): a damaged archive, one deleted under a run, two
writers, read-only media, unwritable output directories and an empty archive file are each one
`error:` line and exit 2, never a traceback, and nothing is lost or half-written."""

from __future__ import annotations

import importlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import ONE_SEED_SCREENED, only_error_line
from typer.testing import CliRunner

from stepml_evolve.archive.store import Archive, ArchiveError
from stepml_evolve.evaluator.outputs import OutputError, write_atomic
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import seed_path

cli_run = importlib.import_module("stepml_evolve.evolve.cli.run_command")  # the module `evolve run` is in
PAGE = 4096
# a tiny run: one seed fitted, two children a generation, screened only; --resume repeats these settings
TINY = ["--seed", "3", "--children", "2", *ONE_SEED_SCREENED]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory) -> Path:
    """A real archive (generation 0: its seed fitted); tests copy it before changing anything."""
    d = tmp_path_factory.mktemp("tiny") / "A"
    res = invoke("run", "--generations", 0, "--archive", d, *TINY)
    assert res.exit_code == 0, res.output
    return d


@pytest.fixture
def archive(tiny_archive, tmp_path) -> Path:
    d = tmp_path / "A"
    shutil.copytree(tiny_archive, d)
    return d


def file_bytes(d: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir()) if f.is_file()}


# ---- a read-only directory, as root too ----


@contextmanager
def read_only(*paths: Path):
    """The paths made read-only for this process: chmod for a user; for root, whom permission bits
    do not stop, the immutable attribute (chattr +i, which os.access and SQLite both honour)."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in paths}
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: no way to make a directory read-only for root")
    done = []
    try:
        for p in paths:
            if subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode != 0:
                pytest.skip(f"running as root and chattr +i is refused on {p} (file system or capability)")
            done.append(p)
        yield
    finally:
        for p in done:
            subprocess.run(["chattr", "-i", str(p)], check=True)


# ---- item 4: a damaged archive ----


def damage_pages(db: Path, count: int) -> None:
    """`dd if=/dev/urandom of=DB bs=4096 seek=... count=COUNT conv=notrunc` over the last COUNT
    pages (the issue's seek=20 is past the end of a tiny archive; its last pages hold evaluation
    rows, which opening the archive does not read), seeded, so every run sees the same damage."""
    pages = db.stat().st_size // PAGE
    assert pages > count + 8, f"{db} has only {pages} pages"
    with open(db, "r+b") as fh:
        fh.seek((pages - count) * PAGE)
        fh.write(random.Random(27).randbytes(count * PAGE))


def test_a_damaged_archive_is_one_line_for_every_command(archive, tmp_path):
    db = archive / Archive.FILE
    damage_pages(db, 2)
    before = db.read_bytes()
    for cmd, reads_the_damage in (
        (["archive", "list"], False),
        (["archive", "show", "best"], True),
        (["archive", "report", "--out", tmp_path / "r.html"], True),
        (["emit-go", "best", "--out", tmp_path / "m.go"], False),
        (["run", "--resume", "--generations", 1, *TINY], True),
    ):
        res = invoke(*cmd, "--archive", archive)
        if reads_the_damage or res.exit_code != 0:
            only_error_line(res, str(db), "not a readable archive")
    assert db.read_bytes() == before  # the resume did not write into it
    assert not (tmp_path / "r.html").exists()


def test_the_writer_checks_the_pages_before_it_writes(archive):
    """Damage in pages a query may not touch is found by PRAGMA quick_check when a writer opens."""
    db = archive / Archive.FILE
    damage_pages(db, 1)
    with pytest.raises(ArchiveError, match="not a readable archive") as e:
        Archive.open(archive, writable=True)
    assert str(db) in str(e.value) and "\n" not in str(e.value)


# ---- item 6: the archive deleted under a run ----


def test_an_archive_deleted_during_a_run_stops_it_with_one_line(tmp_path, monkeypatch):
    """`rm -rf D` after generation 1 of `evolve run --generations 3 --archive D`: the run stops at
    its next write with exit 2, and does not claim the archive."""
    d = tmp_path / "D"
    real_progress = cli_run.run_progress

    @contextmanager
    def progress_then_delete(total, start):
        with real_progress(total, start) as show:

            def on_progress(info):
                show(info)
                if info.get("generation") == 1 and "programs" in info:  # generation 1 is committed
                    shutil.rmtree(d)

            yield on_progress

    monkeypatch.setattr(cli_run, "run_progress", progress_then_delete)
    res = invoke("run", "--generations", 3, "--archive", d, *TINY)
    only_error_line(res, str(d / Archive.FILE), "was deleted while this command was writing it")
    assert "browse:" not in res.output and not (d / Archive.FILE).exists()


def test_an_archive_replaced_under_a_writer_is_not_written(archive, tiny_archive):
    writer = Archive.open(archive, writable=True)
    try:
        (archive / Archive.FILE).unlink()
        shutil.copy(tiny_archive / Archive.FILE, archive / Archive.FILE)
        with pytest.raises(ArchiveError, match="replaced by another file"):
            writer.set_summary(1, {"x": 1})
    finally:
        writer.close()


# ---- item 7: one writer at a time ----


def test_a_second_writer_is_refused_naming_the_holder(archive):
    holder = Archive.open(archive, writable=True)  # a real writer: this process
    try:
        res = invoke("run", "--resume", "--generations", 1, "--archive", archive, *TINY)
        only_error_line(res, str(archive), f"process {os.getpid()} is writing this archive")
        with pytest.raises(ArchiveError, match="one writer at a time"):
            Archive.open(archive, writable=True)
        assert invoke("archive", "list", "--archive", archive).exit_code == 0  # browsing goes on
    finally:
        holder.close()
    Archive.open(archive, writable=True).close()  # released on close


def test_a_writer_dropped_without_close_leaves_no_stuck_lock(archive):
    import gc

    Archive.open(archive, writable=True)  # never closed: only the garbage collector ends it
    gc.collect()
    Archive.open(archive, writable=True).close()  # the same process writes again


def test_a_killed_writer_leaves_no_stuck_lock(archive):
    code = (
        "import sys, time\n"
        "from stepml_evolve.archive.store import Archive\n"
        "a = Archive.open(sys.argv[1], writable=True)\n"
        "print('open', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(archive)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "open"
        with pytest.raises(ArchiveError, match=f"process {proc.pid} is writing"):
            Archive.open(archive, writable=True)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    Archive.open(archive, writable=True).close()
    assert (archive / "archive.lock").read_text().strip() == str(os.getpid())


# ---- item 8: output directories that cannot be written ----


def test_outputs_into_a_read_only_directory_are_refused_before_any_work(archive, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    plain = tmp_path / "plain-file"
    plain.write_text("not a directory\n")
    program = seed_path("roofline")
    with read_only(ro):
        for where, says in ((ro, "is not writable"), (plain, "is not a directory")):  # the second holds for root too
            for cmd in (
                ["archive", "report", "--archive", archive, "--out", where / "r.html"],
                ["emit-go", "best", "--archive", archive, "--out", where / "m.go"],
                ["fit", program, "--max-evals", 2, "--out", where / "f.py"],
                ["data", "synth", "--out", where / "sample"],
            ):
                only_error_line(invoke(*cmd), str(where), says)
        only_error_line(invoke("data", "synth", "--out", ro), str(ro), "is not writable")
        assert list(ro.iterdir()) == []
    assert plain.read_text() == "not a directory\n"


def test_a_write_that_fails_after_the_checks_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    with read_only(ro), pytest.raises(OutputError) as e:
        write_atomic(ro / "x.txt", "text")
    assert str(ro / "x.txt") in str(e.value) and "cannot write" in str(e.value) and "\n" not in str(e.value)
    assert list(ro.iterdir()) == []


# ---- item 9: archives on read-only media ----


def test_a_read_only_copy_is_browsable_and_a_writer_gets_the_real_reason(archive, tmp_path):
    db = archive / Archive.FILE
    before = file_bytes(archive)
    with read_only(db, archive):
        for cmd in (
            ["archive", "list"],
            ["archive", "show", "best"],
            ["archive", "pareto"],
            ["archive", "report", "--out", tmp_path / "r.html"],
            ["emit-go", "best", "--out", tmp_path / "m.go"],
        ):
            res = invoke(*cmd, "--archive", archive)
            assert res.exit_code == 0, res.output
        only_error_line(
            invoke("run", "--resume", "--generations", 1, "--archive", archive, *TINY),
            str(db),
            "the archive is read-only",
        )
    assert file_bytes(archive) == before  # no -shm, no -wal, no lock file: nothing written
    assert (tmp_path / "r.html").stat().st_size > 0 and (tmp_path / "m.go").stat().st_size > 0


def test_an_immutable_archive_file_in_a_writable_directory(archive):
    db = archive / Archive.FILE
    with read_only(db):
        assert invoke("archive", "list", "--archive", archive).exit_code == 0
        only_error_line(
            invoke("run", "--resume", "--generations", 1, "--archive", archive, *TINY),
            str(db),
            "the archive is read-only (the file cannot be written)",
        )


def test_a_read_only_directory_with_changes_left_in_the_wal_is_one_line(archive, tmp_path):
    """Opened immutable, SQLite would not read the -wal file: the archive would look older than it is."""
    live = sqlite3.connect(archive / Archive.FILE, isolation_level=None)
    live.execute("PRAGMA wal_autocheckpoint=0")
    live.execute("INSERT OR REPLACE INTO meta VALUES ('note', 'in the wal only')")
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in (Archive.FILE, Archive.FILE + "-wal"):  # as copied while the writer was running
        shutil.copy(archive / name, copy / name)
    live.close()
    with read_only(copy):
        only_error_line(invoke("archive", "list", "--archive", copy), "holds changes not yet in the database")


# ---- item 12: an empty archive file ----


def test_an_empty_archive_file_is_never_taken_for_a_new_run(tmp_path):
    d = tmp_path / "E"
    d.mkdir()
    (d / Archive.FILE).write_bytes(b"")
    only_error_line(
        invoke("run", "--resume", "--generations", 1, "--archive", d, *TINY),
        str(d / Archive.FILE),
        "empty file (0 bytes)",
    )
    only_error_line(invoke("archive", "list", "--archive", d), "empty file (0 bytes)")
    assert (d / Archive.FILE).stat().st_size == 0
