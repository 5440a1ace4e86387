"""Bad output paths and impossible programs: one-line errors (exit 2) before any work, and no
file lost or half-written."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from evolve.cli import app
from seeds import seed_path

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
    one_line_error(invoke("emit-go", program, "--out", tmp_path / "m.go", "--test-out", tmp_path / "m.go"), "two outputs")
    one_line_error(invoke("emit-go", program, "--out", tmp_path / "nodir" / "m.go"), "does not exist")
    assert program.read_text() == before and not (tmp_path / "m.go").exists()


def test_a_program_that_cannot_be_evaluated_is_not_fitted_or_seeded(tmp_path):
    zero = tmp_path / "zero.py"
    zero.write_text(ZERO)
    one_line_error(invoke("fit", zero, "--max-evals", 8, "--out", tmp_path / "z.fitted.py"), str(zero), "non-positive")
    assert not (tmp_path / "z.fitted.py").exists()
    one_line_error(invoke("run", "--generations", 1, "--archive", tmp_path / "run", "--seeds", zero, "--seed-fit-evals", 8),
                   "none of the seed programs can be evaluated")


def test_synth_never_writes_into_a_directory_that_holds_something(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    one_line_error(invoke("data", "synth", "--out", tmp_path), "not an empty directory")
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_run_refuses_a_file_as_archive_and_out_of_range_settings(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    one_line_error(invoke("run", "--generations", 1, "--archive", f), "is a file")
    for flag, value in (("--workers", 0), ("--islands", 0), ("--children", 0), ("--generations", -1), ("--llm-ratio", 5)):
        res = invoke("run", flag, value, "--archive", tmp_path / "never")
        assert res.exit_code == 2 and flag in res.output, (flag, res.output)
    assert not (tmp_path / "never").exists()
