"""The command line's allocator setting (evolve/cli/memory.py): freed arrays of a few MB are
reused from the heap instead of costing fresh page faults each time."""

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only"
)

FAULTS = """
import resource, sys
import numpy as np
if sys.argv[1] == "set":
    from stepml_evolve.evolve.cli.memory import keep_freed_memory
    assert keep_freed_memory()
for _ in range(3):  # the heap grows (and glibc's thresholds adapt) once
    a = [np.ones(1 << 20) for _ in range(3)]; del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):  # three 8 MB arrays at once, freed together, as a replay's buffers are
    a = [np.ones(1 << 20) for _ in range(3)]; del a
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_freed_arrays_are_reused_without_page_faults():
    plain, kept = faults("plain"), faults("set")
    # glibc's default hands freed heap above its adaptive trim threshold back each time, so every
    # round faults pages in again (about 1,000 of the 6,144 here)
    assert plain > 50 * 500
    assert kept < plain / 20
