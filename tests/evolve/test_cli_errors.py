"""Bad output paths and impossible programs: one-line errors (exit 2) before any work, and no
file lost or half-written."""

from __future__ import annotations

import pytest
from conftest import only_error_line
from typer.testing import CliRunner

from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import seed_path

ZERO = 'CONSTANTS = {"a": 1.0}\ndef step_time(f, c):\n    return c.a - c.a\n'


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(res, *texts):
    assert res.exit_code == 2, res.output
    last = res.stderr.strip().splitlines()[-1]
    assert all(t in last for t in texts), res.stderr
    assert "Traceback" not in res.output


@pytest.fixture
def program(tmp_path):
    p = tmp_path / "rf.py"
    p.write_text(seed_path("roofline").read_text())
    return p


def test_fit_never_writes_over_its_input_or_into_a_missing_directory(program, tmp_path):
    before = program.read_text()
    one_line_error(invoke("fit", program, "--max-evals", 8, "--out", program), str(program), "is an input")
    assert program.read_text() == before
    one_line_error(invoke("fit", program, "--max-evals", 8, "--out", tmp_path / "nodir" / "x.py"), "does not exist")
    one_line_error(invoke("fit", program, "--max-evals", 8, "--out", tmp_path), "is a directory")


def test_emit_go_never_writes_over_its_input_or_one_output_over_the_other(program, tmp_path):
    before = program.read_text()
    one_line_error(invoke("emit-go", program, "--out", program), "is an input")
    one_line_error(invoke("emit-go", program, "--out", tmp_path / "m.go", "--test-out", program), "is an input")
    one_line_error(
        invoke("emit-go", program, "--out", tmp_path / "m.go", "--test-out", tmp_path / "m.go"), "two outputs"
    )
    one_line_error(invoke("emit-go", program, "--out", tmp_path / "nodir" / "m.go"), "does not exist")
    assert program.read_text() == before and not (tmp_path / "m.go").exists()


def test_a_program_that_cannot_be_evaluated_is_not_fitted_or_seeded(tmp_path):
    zero = tmp_path / "zero.py"
    zero.write_text(ZERO)
    out = tmp_path / "z.fitted.py"
    # a step time of c.a - c.a (0, below the floor): a difference of constants, refused before any fit, as a seed too
    one_line_error(
        invoke("fit", zero, "--max-evals", 8, "--out", out), str(zero), "a difference of constants", "[sign]"
    )
    one_line_error(
        invoke(
            "run",
            "--generations",
            1,
            "--archive",
            tmp_path / "run",
            "--seed-programs",
            zero,
            "--seed-program-fit-evals",
            8,
        ),
        "none of the seed programs can be evaluated",
        "a difference of constants",
    )
    # without the floor, the fit finds no constants that replay
    one_line_error(
        invoke("fit", zero, "--max-evals", 8, "--out", out, "--physics", "off", "--no-profile"),
        str(zero),
        "non-positive",
    )
    assert not out.exists()
    one_line_error(
        invoke(
            "run",
            "--generations",
            1,
            "--archive",
            tmp_path / "run2",
            "--seed-programs",
            zero,
            "--seed-program-fit-evals",
            8,
            "--physics",
            "off",
        ),
        "none of the seed programs can be evaluated",
        "non-finite",
    )


def test_synth_never_writes_into_a_directory_that_holds_something(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    one_line_error(invoke("data", "synth", "--out", tmp_path), "not an empty directory")
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_run_refuses_a_file_as_archive_and_out_of_range_settings(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    one_line_error(invoke("run", "--generations", 1, "--archive", f), "is a file")
    for flag, value in (
        ("--workers", 0),
        ("--islands", 0),
        ("--children", 0),
        ("--generations", -1),
        ("--llm-ratio", 5),
    ):
        res = invoke("run", flag, value, "--archive", tmp_path / "never")
        assert res.exit_code == 2 and flag in res.output, (flag, res.output)
    assert not (tmp_path / "never").exists()


# ---- every user error: one `error:` line on stderr, exit code 2, through the one handler ----


def alone(res, *texts):
    """The error line is all of stderr."""
    only_error_line(res, *texts)
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def _archive(directory, version=None):
    import sqlite3

    from stepml_evolve.archive.store import Archive

    Archive(directory, create=True).close()
    if version is not None:
        db = sqlite3.connect(directory / Archive.FILE)
        db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))
        db.commit()
        db.close()


def test_missing_or_empty_data_directory(program, tmp_path):
    alone(invoke("eval", program, "--data", tmp_path / "nowhere"), f"{tmp_path / 'nowhere'}: no such data directory")
    alone(invoke("data", "check", "--data", tmp_path / "nowhere"), "no such data directory")
    alone(invoke("bench", "--data", tmp_path / "nowhere", "--skip-fit"), "no such data directory")
    (tmp_path / "ref.json").write_text("{not json")
    alone(
        invoke("bench", "--skip-fit", "--reference", tmp_path / "ref.json"), f"{tmp_path / 'ref.json'}: malformed JSON"
    )
    (tmp_path / "ref.json").write_text('{"data": "x"}')
    alone(invoke("bench", "--skip-fit", "--reference", tmp_path / "ref.json"), "no figure of evolve bench --json")
    (tmp_path / "empty").mkdir()
    alone(invoke("fit", program, "--data", tmp_path / "empty"), "no experiment directories found")


def test_a_program_the_dsl_rejects_names_file_line_and_rule(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def step_time(f, c):\n    return open('x')\n")
    for cmd in (["eval", bad], ["fit", bad], ["emit-go", bad, "--out", tmp_path / "m.go"]):
        alone(invoke(*cmd), str(bad), "line 2", "open", "[call]")  # the rule is shown, not eaten as markup
    alone(invoke("eval", tmp_path / "missing.py"), str(tmp_path / "missing.py"), "cannot read program")
    alone(invoke("emit-go", tmp_path / "missing.py", "--out", tmp_path / "m.go"), "no such program file")


def test_corrupt_and_newer_schema_archives_for_every_reader(tmp_path):
    corrupt, newer = tmp_path / "corrupt", tmp_path / "newer"
    corrupt.mkdir()
    (corrupt / "archive.sqlite").write_bytes(b"not sqlite at all" * 300)
    newer.mkdir()
    from stepml_evolve.archive.store import SCHEMA_VERSION

    _archive(newer, SCHEMA_VERSION + 1)
    readers = (
        ["archive", "list"],
        ["archive", "show", "best"],
        ["archive", "show", "best", "--source"],
        ["archive", "pareto"],
        ["archive", "diff", "1", "2"],
        ["archive", "report", "--out", tmp_path / "r.html"],
        ["emit-go", "best", "--out", tmp_path / "m.go"],
    )
    for cmd in readers:
        alone(invoke(*cmd, "--archive", corrupt), "not a readable archive")
        alone(invoke(*cmd, "--archive", newer), "is newer than this stepml-evolve reads")
    only_error_line(
        invoke("run", "--generations", 0, "--archive", newer, "--seed-program-fit-evals", 8),
        "is newer than this stepml-evolve reads",
    )
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "m.go").exists()


def test_bad_seeds_stop_the_run_before_anything_is_loaded(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "same.py").write_text(seed_path("roofline").read_text())
    run = ["run", "--generations", 0, "--archive", tmp_path / "run"]
    alone(invoke(*run, "--seed-programs", tmp_path / "nope.py"), "no such seed program file or directory")
    alone(invoke(*run, "--seed-programs", tmp_path / "empty"), "no seed programs (*.py) in this directory")
    alone(
        invoke(*run, "--seed-programs", tmp_path / "a", "--seed-programs", tmp_path / "b"), "a second seed named 'same'"
    )
    assert not (tmp_path / "run").exists()


def test_output_paths_over_inputs_or_files_are_refused(program, tmp_path):
    only_error_line(invoke("fit", program, "--out", program), "is an input")
    alone(invoke("emit-go", program, "--out", program), "is an input")
    f = tmp_path / "file"
    f.write_text("x")
    alone(invoke("run", "--generations", 0, "--archive", f), "is a file; --archive takes a directory")


@pytest.mark.parametrize(
    "args, flag",
    [
        (["eval", "PROGRAM", "--split", "everything"], "--split"),
        (["fit", "PROGRAM", "--scope", "cluster"], "--scope"),
        (["emit-go", "PROGRAM", "--target", "v9"], "--target"),
        (["data", "check", "--output-len", "guess"], "--output-len"),
        (["archive", "list", "--sort", "size"], "--sort"),
    ],
)
def test_an_unknown_choice_is_a_usage_error_naming_the_option(program, args, flag):
    res = invoke(*[program if a == "PROGRAM" else a for a in args])
    assert res.exit_code == 2 and flag in res.stderr and "is not one of" in res.stderr, res.output
    assert "Traceback" not in res.output


def test_main_reports_a_user_error_in_one_line(tmp_path):
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "stepml_evolve", "eval", str(tmp_path / "missing.py")], capture_output=True, text=True
    )
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr


def test_no_output_lands_on_an_archive_a_device_or_a_missing_directory(searched_archive, program, tmp_path):
    """An archive is an input of every command that reads it; the rule is the writer's, so it holds
    for every command: no output over a SQLite database or its side files, over anything but a
    regular file, or into a directory that does not exist (the report made one; no longer)."""
    import os
    import shutil

    archive = tmp_path / "archive"
    shutil.copytree(searched_archive, archive)
    db = archive / "archive.sqlite"
    (archive / "archive.sqlite-wal").write_bytes(b"")  # as a live run leaves it
    before = db.read_bytes()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args, says in (
        (["emit-go", "best", "--archive", archive, "--out", db], "is a SQLite database"),
        (
            ["emit-go", "best", "--archive", archive, "--out", tmp_path / "m.go", "--test-out", db],
            "is a SQLite database",
        ),
        (["emit-go", "best", "--archive", archive, "--out", archive / "archive.sqlite-wal"], "is a SQLite database"),
        (["archive", "report", "--archive", archive, "--out", db], "is a SQLite database"),
        (["fit", program, "--max-evals", 2, "--out", db], "is a SQLite database"),
        (["emit-go", program, "--out", fifo], "is not a regular file"),
        (["archive", "report", "--archive", archive, "--out", fifo], "is not a regular file"),
        (["archive", "report", "--archive", archive, "--out", tmp_path / "nodir" / "r.html"], "does not exist"),
    ):
        res = invoke(*args)
        one_line_error(res, says)
    assert db.read_bytes() == before and fifo.is_fifo() and not (tmp_path / "nodir").exists()
    assert not (tmp_path / "m.go").exists()
