"""The README's example output comes from a captured run of its first command (issue 65, item 3):
tools/readme_example.py writes a log's excerpt into the README (`capture LOG`) and checks the
README against a log with the timings masked (`--check LOG`, which .ci/run runs after the tests
on its own run of the first command)."""

from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("readme_example", ROOT / "tools" / "readme_example.py")
readme_example = importlib.util.module_from_spec(spec)
sys.modules["readme_example"] = readme_example
spec.loader.exec_module(readme_example)

DEPLOYED = (
    "deployed by `evolve emit-go` (rule guarded): #1; guarded: #1, the lowest lomo CV loss among the seeds and the "
    "programs that beat their own seed's by more than 20% and stay within 1.5x of that seed's step times on 95% of "
    "the steps users simulate (the best, #8: 3.1171; of 5 programs cross-validated with seed 7, max-evals 8, "
    "trust-region, rms)"
)


def _wrapped(line: str, width: int = 200) -> list[str]:
    """The line as the console prints it to a pipe: cut at the last space within the width, the
    space kept at the end of the piece."""
    pieces = []
    while len(line) > width:
        cut = line.rfind(" ", 0, width) + 1
        pieces.append(line[:cut])
        line = line[cut:]
    return pieces + [line]


def _log(rate: str = "3.8", loss: str = "9.138") -> str:
    generations = [
        f"gen {n}  programs {4 + 4 * n} (4 fully evaluated)  best train 0.522  best val 1.958  {rate} evals/s  rejected: floor {n + 1}"
        for n in range(11)
    ]
    return "\n".join(
        [
            "Successfully installed stepml-evolve-0.1.0",
            "using the built-in synthetic sample: synthetic sample (/root/.cache/x) (pass --data DIR for real experiments)",
            "archive: runs/synthetic-seed7  (generations 0..10)",
            "seed blackbox: rejected by --physics check (floor): step_time is 0.044x the physical floor",
            "seed phase_decomposed: val loss 1.958",
            f"seed trained_physics: val loss {loss}",
            *generations,
            "cross-validating 5 program(s), the front and the seeds, lomo (--front-cv none skips this)",
            "#3 (1 of 5): lomo, 4 folds",
            "best program by validation loss: #8 (generation 2, add_term), val loss 1.581, test loss 0.740, complexity 39",
            "baseline blackbox (never searched from): val loss 55.815, test loss 58.143, test mean E2E error 26.2 % "
            "(the best program: 3.3 %)",
            "      program #8: test split, absolute % error of means       ",
            "│ synth-llama-2-70b-tp4-codegen     │ 300 │ 0.4 │  0.3 │ 0.4 │",
            *_wrapped(DEPLOYED),
            # a line of its own after the wrapped one: not part of it
            "deployed with c_comm pinned to seed #1's fit (the training data do not tell them apart)",
            "archive: runs/synthetic-seed7  (browse: evolve archive list --archive runs/synthetic-seed7)",
            "",
            "real\t4m18.2s",
        ]
    )


@pytest.fixture
def readme(tmp_path):
    path = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", path)
    return path


def _run(*args) -> int:
    return readme_example.main([str(arg) for arg in args])


def test_the_readme_has_the_block_the_tool_writes():
    lines = (ROOT / "README.md").read_text().splitlines()
    start, end = readme_example.block_bounds(lines, ROOT / "README.md")
    block = lines[start:end]
    assert any(readme_example.GENERATION.match(line) for line in block)
    assert block[-1].startswith(readme_example.DEPLOYED) and block[-2] == "..."
    best = next(i for i, line in enumerate(block) if line.startswith(readme_example.BEST))
    # the baselines follow the best program, and no shipped program is refused in generation 0
    assert block[best + 1].startswith(readme_example.BASELINE + "blackbox")
    assert not any("rejected" in line for line in block[: best - 1] if not readme_example.GENERATION.match(line))


def test_capture_keeps_the_run_s_lines_and_the_check_passes(readme, tmp_path):
    log = tmp_path / "run.log"
    log.write_text(_log())
    assert _run("capture", log, "--readme", readme) == 0
    lines = readme.read_text().splitlines()
    start, end = readme_example.block_bounds(lines, readme)
    block = lines[start:end]
    assert block[0].startswith("seed blackbox: rejected") and block[2] == "seed trained_physics: val loss 9.138"
    assert [line.split("  ")[0] for line in block[3:8]] == ["gen 0", "gen 1", "gen 2", "...", "gen 10"]
    assert block[-1] == DEPLOYED  # the console's wrap undone, the line as printed
    assert len(_wrapped(DEPLOYED)) > 1
    assert block[-4].startswith(readme_example.BEST) and block[-3].startswith("baseline blackbox")
    # the rest of the README is untouched
    original = (ROOT / "README.md").read_text().splitlines()
    o_start, o_end = readme_example.block_bounds(original, ROOT / "README.md")
    assert lines[:start] == original[:o_start] and lines[end:] == original[o_end:]
    assert _run("--check", log, "--readme", readme) == 0


def test_the_check_allows_for_timings_and_nothing_else(readme, tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text(_log())
    assert _run("capture", log, "--readme", readme) == 0
    other_machine = tmp_path / "other.log"
    other_machine.write_text(_log(rate="12.4"))
    assert _run("--check", other_machine, "--readme", readme) == 0
    another_loss = tmp_path / "loss.log"
    another_loss.write_text(_log(loss="8.149"))
    assert _run("--check", another_loss, "--readme", readme) == 1
    err = capsys.readouterr().err
    assert (
        "README: seed trained_physics: val loss 9.138" in err and "run:    seed trained_physics: val loss 8.149" in err
    )


def test_masks_are_for_timings():
    masked = readme_example.masked
    assert masked("4:18 wall, 21.8 s a generation (12 s), 350 ms, on 2026-12-06, runs/20261206-101500") == masked(
        "7:06 wall, 34.9 s a generation (9 s), 120 ms, on 2027-01-02, runs/20270102-090000"
    )
    for line in ("val loss 1.958", "LOMO 3.12 against 3.77", "0.044x the physical floor", "#8: 3.1171"):
        assert masked(line) == line


def test_a_log_of_another_command_is_refused(readme, tmp_path):
    log = tmp_path / "run.log"
    log.write_text("Successfully installed stepml-evolve-0.1.0\n")
    assert _run("--check", log, "--readme", readme) == 2
    assert _run("capture", log, "--readme", readme) == 2
