"""Baselines (seeds/baselines/: BLIS's blackbox regression): scored beside the seeds at a run's
end, fitted without the floor they do not keep, never a seed, a parent or a program of the archive."""

from __future__ import annotations

import json
import math

import pytest
from conftest import archive_rows, tiny_run
from typer.testing import CliRunner

from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import baseline_paths, load_seeds, seed_paths


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
    archive = tmp_path_factory.mktemp("baselines") / "run"
    res = tiny_run(archive, 1, "--baselines")
    assert res.exit_code == 0, res.output
    return archive, res.output


def test_blackbox_is_a_baseline_not_a_seed():
    assert [p.stem for p in baseline_paths()] == ["blackbox"]
    assert "blackbox" not in {p.stem for p in seed_paths()}
    # a user's seeds directory of the shipped seeds holds no baseline either
    assert "blackbox" not in {name for name, _ in load_seeds([seed_paths()[0].parent])}


def test_a_run_shows_no_refused_shipped_program_and_scores_the_baseline_beside_the_best(baseline_run):
    archive, output = baseline_run
    assert "rejected" not in output.split("gen 0")[0]  # generation 0: every shipped seed is searched from
    line = next(x for x in output.splitlines() if x.startswith("baseline blackbox"))
    assert "val loss" in line and "(the best program:" in line
    # never a program of the archive, so never a parent or a deployed program
    assert ("blackbox",) not in archive_rows(archive, "select operator_detail from programs")
    assert archive_rows(archive, "select count(*) from rejections where operator = 'seed'") == [(0,)]
    (summary,) = archive_rows(archive, "select summary from runs")
    (baseline,) = json.loads(summary[0])["baselines"]
    assert baseline["name"] == "blackbox"
    # replayed without the floor: under it every replay of blackbox fails (it is below the floor
    # on long prefills), and its losses would not be numbers
    assert all(math.isfinite(baseline[k]) for k in ("train_loss", "val_loss", "test_loss", "test_e2e_ape"))
    report = archive.parent / "report.html"
    res = CliRunner().invoke(app, ["archive", "report", "--archive", str(archive), "--out", str(report)])
    assert res.exit_code == 0, res.output
    assert "baseline blackbox</dt>" in report.read_text()


def test_the_baseline_fit_is_reproducible_and_can_be_skipped(baseline_run, tmp_path):
    archive, output = baseline_run
    (first,) = archive_rows(archive, "select summary from runs")
    again = tiny_run(tmp_path / "again", 1, "--baselines")
    assert again.exit_code == 0, again.output
    (second,) = archive_rows(tmp_path / "again", "select summary from runs")
    assert json.loads(second[0])["baselines"] == json.loads(first[0])["baselines"]
    skipped = tiny_run(tmp_path / "skipped", 1)  # TINY_BUDGETS say --no-baselines
    assert skipped.exit_code == 0 and "baseline blackbox" not in skipped.output
    (summary,) = archive_rows(tmp_path / "skipped", "select summary from runs")
    assert "baselines" not in json.loads(summary[0])


def test_floor_off_lifts_the_pools_floor_only_inside_and_restores_it_after_an_error(synthetic):
    with ReplayPool(synthetic.experiments[:1], 1, floor=True) as pool:
        with pool.floor_off():
            assert pool.floor is False
        assert pool.floor is True
        with pytest.raises(RuntimeError), pool.floor_off():
            raise RuntimeError("a fit that fails")
        assert pool.floor is True
