"""`evolve bench` reports the documented figures (their values are measurements, not asserted)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from stepml_evolve.evolve.cli.app import app


def test_bench_json_has_the_documented_keys(synthetic):
    res = CliRunner().invoke(
        app, ["bench", "--data", str(synthetic.directory), "--skip-fit", "--search-generations", "1", "--json"]
    )
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    for key in ("replay_s_largest", "full_eval_s", "quick_fit_s", "generations_per_hour"):
        assert isinstance(figures[key], (int, float)) and figures[key] > 0, key
    assert figures["replay_requests_largest"] == max(e.n_requests for e in synthetic.experiments)
    assert figures["generations_timed"] == 1 and figures["workers"] >= 1
    assert figures["fit_s"] is None  # skipped, but still listed
