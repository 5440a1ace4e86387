"""The code is as `ruff format` and `ruff check` leave it (the rules are in pyproject.toml)."""

import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.parametrize("args", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_the_code_is_as_ruff_leaves_it(args):
    proc = subprocess.run([sys.executable, "-m", "ruff", *args, "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
