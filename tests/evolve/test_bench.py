"""`evolve bench` reports the documented figures (their values are measurements, not asserted)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from stepml_evolve.evolve.cli.app import app


def test_bench_json_has_the_documented_keys(synthetic, tmp_path):
    args = [
        "bench",
        "--data",
        str(synthetic.directory),
        "--skip-fit",
        "--search-generations",
        "1",
        "--seed-program-fit-evals",
        "4",
    ]
    res = CliRunner().invoke(app, [*args, "--search-cv", "lomo", "--baseline", "--json"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    for key in (
        "replay_s_largest",
        "full_eval_s",
        "quick_fit_s",
        "generations_per_hour",
        "generation_0_s",
        "generation_s_mean",
        "cv_generation_s_mean",
        "baseline_generation_0_s",
        "baseline_generation_s_mean",
    ):
        assert isinstance(figures[key], (int, float)) and figures[key] > 0, key
    # the ratios are of the figures reported beside them
    assert figures["cv"] == "lomo"
    assert abs(figures["cv_generation_ratio"] - figures["cv_generation_s_mean"] / figures["generation_s_mean"]) < 0.01
    speedup = figures["baseline_generation_0_s"] / figures["generation_0_s"]
    assert abs(figures["generation_0_speedup"] - speedup) < 0.01 * max(1.0, speedup)
    assert figures["replay_requests_largest"] == max(e.n_requests for e in synthetic.experiments)
    assert figures["generations_timed"] == 1 and figures["workers"] >= 1
    assert figures["fit_s"] is None  # skipped, but still listed

    # that output is a reference a later bench compares itself with, figure by figure
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps({**figures, "full_eval_s": figures["full_eval_s"] * 4}))
    res = CliRunner().invoke(
        app,
        ["bench", "--data", str(synthetic.directory), "--skip-fit", "--search-generations", "0"]
        + ["--reference", str(reference), "--json"],
    )
    assert res.exit_code == 0, res.output
    now = json.loads(res.stdout)
    compared = now["against_reference"]["figures"]
    assert now["against_reference"]["file"] == str(reference)
    assert set(compared) == {"replay_s_largest", "full_eval_s", "quick_fit_s"}  # the search was not timed now
    for name, row in compared.items():
        then = figures[name] * (4 if name == "full_eval_s" else 1)
        assert row["value"] == now[name] and row["reference"] == then
        assert abs(row["ratio"] - now[name] / then) < 1e-3
    assert f"against {reference}: replay_s_largest" in res.stderr
