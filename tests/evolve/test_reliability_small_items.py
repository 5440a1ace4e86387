"""The smaller items of issue 55: the Python API refuses what its command refuses (an unknown
split, max_evals 0) with a one-line UserError; an error quoting a 10 MB input quotes a few dozen
characters of it; a newline in an archive's path stays inside the Go file's `//` comment; the
report of an archive at a non-ASCII path is written in the C locale; `emit-go` on a device says
what the device is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ONE_SEED_SCREENED, only_error_line
from typer.testing import CliRunner

import stepml_evolve
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import seed_path

TEN_MB = "x" * 10_000_000


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory) -> Path:
    """A real archive: generation 0 of a one-seed run (screening fits only)."""
    d = tmp_path_factory.mktemp("tiny") / "A"
    res = invoke("run", "--generations", 0, "--archive", d, "--seed", 3, "--children", 2, *ONE_SEED_SCREENED)
    assert res.exit_code == 0, res.output
    return d


def _one_line_user_error(call, *texts) -> str:
    with pytest.raises(UserError) as e:
        call()
    message = str(e.value)
    assert "\n" not in message and len(message) < 400 and all(t in message for t in texts), message[:400]
    return message


def test_score_on_an_unknown_split_is_a_one_line_user_error():
    _one_line_user_error(
        lambda: stepml_evolve.score(seed_path("roofline"), split="bogus"), "split must be one of", "'bogus'"
    )


def test_fit_with_max_evals_0_is_refused_as_the_command_refuses_it():
    _one_line_user_error(lambda: stepml_evolve.fit(seed_path("roofline"), max_evals=0), "max_evals", "at least 1")
    res = invoke("fit", seed_path("roofline"), "--max-evals", 0)  # the command's own rule (typer's usage error)
    assert res.exit_code == 2 and "--max-evals" in res.output


def test_an_error_quoting_a_10_mb_input_quotes_a_few_dozen_characters_of_it():
    for call in (stepml_evolve.score, stepml_evolve.emit_go, stepml_evolve.fit):
        _one_line_user_error(lambda call=call: call(TEN_MB), "(10,000,000 characters)")
    # program text (it holds a newline) of 10 MB: the DSL's size rule, also short
    _one_line_user_error(lambda: stepml_evolve.score("def step_time(f, c):\n    return " + TEN_MB), "exceeds")


def test_a_newline_in_the_archive_path_stays_inside_the_go_comment(tiny_archive, tmp_path):
    archive = tmp_path / "runs\nnext"
    shutil.copytree(tiny_archive, archive)
    out = tmp_path / "m.go"
    res = invoke("emit-go", "best", "--archive", archive, "--out", out)
    assert res.exit_code == 0, res.output
    head = out.read_text().split("\npackage ")[0].splitlines()
    assert all(line.startswith("//") or not line for line in head), head
    assert any("runs\\nnext" in line for line in head)
    # the program file's `# fitted:` header too: two comment lines, parsed back as written
    from stepml_evolve.evaluator.fit.fitted_header import FittedHeader

    res = invoke("archive", "show", "best", "--archive", archive, "--source")
    assert res.exit_code == 0, res.output
    header = [line for line in res.stdout.splitlines() if line.startswith("# fitted:")]
    assert len(header) == 2 and "runs\\nnext" in header[0]
    assert FittedHeader.parse(res.stdout) is not None


def test_the_report_of_an_archive_at_a_non_ascii_path_is_written_in_the_c_locale(tiny_archive, tmp_path):
    archive = tmp_path / "ärchive-ß"
    shutil.copytree(tiny_archive, archive)
    out = tmp_path / "report.html"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepml_evolve.evolve",
            "archive",
            "report",
            "--archive",
            str(archive),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""},
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "ärchive-ß" in out.read_text(encoding="utf-8")


def test_emit_go_on_a_device_path_says_what_the_device_is(tmp_path):
    only_error_line(invoke("emit-go", "/dev/null", "--out", tmp_path / "m.go"), "/dev/null", "a character device")
    assert not (tmp_path / "m.go").exists()
