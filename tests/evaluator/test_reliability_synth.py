"""`evolve data synth` checks before it writes and writes whole or not at all (issue 55).

A world law whose step time is absurd (1e14 us a step: every replay passes, no request finishes
within its client's limit) is refused in one line naming the law before anything is written. The
built-in sample and a world are written into a temporary directory beside --out and renamed, so
a write that fails half-way (here a real one: the file-size limit, RLIMIT_FSIZE, stands in for a
full disk) leaves nothing behind, and the same command run again is not refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import only_error_line
from typer.testing import CliRunner

from stepml_evolve.evaluator.known_truth import WorldError, load_world, write_world
from stepml_evolve.evolve.cli.app import app

ABSURD_LAW = '''"""Absurd: a step of 1e14 us (three years), whatever the batch."""
CONSTANTS = {"a": 1.0}


def step_time(f, c):
    return 1e14 + c.a * f.weights
'''


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_a_law_whose_requests_never_finish_is_refused_before_anything_is_written(tmp_path):
    law = tmp_path / "absurd.py"
    law.write_text(ABSURD_LAW)
    out = tmp_path / "world"
    res = invoke("data", "synth", "--world", law, "--size", "small", "--out", out)
    only_error_line(res, "world absurd:", "finishes 0 of", "not the step time of a server", "nothing written")
    assert not out.exists() and os.listdir(tmp_path) == ["absurd.py"]
    with pytest.raises(WorldError, match="world absurd: its law finishes 0 of"):
        write_world(load_world(str(law)), tmp_path / "again", seed=0, size="small")


def _synth_with_file_size_limit(out, limit_bytes: int | None, *args) -> subprocess.CompletedProcess:
    """`evolve data synth` in a process whose files may not grow past limit_bytes (Python ignores
    SIGXFSZ, so the write past it fails with EFBIG, as a full disk fails it with ENOSPC)."""

    command = [sys.executable, "-m", "stepml_evolve.evolve", "data", "synth", "--out", str(out), *args]
    if limit_bytes is not None:
        # the limit is set by a small Python that then execs the command, not by preexec_fn: a
        # pytest worker that ran the Ray tests has gRPC threads, and a child forked beside them
        # can abort in gRPC's fork handlers before it execs
        command = [
            sys.executable,
            "-c",
            "import os, resource, sys; limit = int(sys.argv[1]); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); os.execv(sys.argv[2], sys.argv[2:])",
            str(limit_bytes),
            *command,
        ]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "STEPML_SAMPLE_SIZE": "small"})


@pytest.mark.parametrize(
    "args,limit_bytes",
    [
        ((), 32_000),  # the small sample's requests.json files are 31 KB to 39 KB: it fails half-way
        (("--world", "launch_bound", "--size", "small"), 15_900),  # a world's are 15.8 KB to 16.0 KB
    ],
    ids=["sample", "world"],
)
def test_a_synth_that_fails_half_way_leaves_nothing_and_a_rerun_is_not_refused(tmp_path, args, limit_bytes):
    out = tmp_path / "synth"
    res = _synth_with_file_size_limit(out, limit_bytes, *args)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "cannot write" in errors[0] and "nothing written" in errors[0], res.stderr
    assert os.listdir(tmp_path) == []  # neither the directory nor a temporary one beside it
    again = _synth_with_file_size_limit(out, None, *args)
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(tmp_path)) == ["synth"] and len(os.listdir(out)) >= 4
