"""`evolve run --patience N`: the run stops once the best validation loss has not fallen by more
than 0.5% for N completed generations, and a resumed run stops at the same place; and resuming an
archive stored before fit_method/objective/weights were settings (`LEGACY_SETTINGS`)."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from conftest import LEAN, snapshot
from typer.testing import CliRunner

from stepml_evolve.archive.records import GenerationRecord
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.search import LEGACY_SETTINGS, PATIENCE_GAIN, Search, SearchConfig

# cmaes: the plain closed loop, small budgets; no promotions, so no child is fully evaluated and
# the best validation loss is the seeds' from generation 0 on (patience must run out)
STALL = [
    "--fit-method",
    "cmaes",
    "--seed-program-fit-evals",
    "6",
    "--quick-evals",
    "3",
    "--children",
    "2",
    "--max-promotions",
    "0",
    "--front-cv",
    "none",
    *LEAN,
]
GENERATIONS = 6


def run(archive, *extra, generations=GENERATIONS, ok=True):
    res = CliRunner().invoke(
        app,
        ["run", "--generations", str(generations), "--seed", "5", "--archive", str(archive), *STALL, *extra, "--json"],
    )
    if ok:
        assert res.exit_code == 0, res.output
    return res


def upto(snap: dict, generation: int) -> dict:
    """The part of a snapshot written by generations 0..generation (evaluations: those of the
    programs those generations wrote)."""
    part = {
        k: [r for r in rows if r[0 if k == "generations" else 1] <= generation]
        for k, rows in snap.items()
        if k != "evaluations"
    }
    kept = {p[0] for p in part["programs"]}
    part["evaluations"] = [r for r in snap["evaluations"] if r[0] in kept]
    return part


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    """A run with --patience 2 on settings where the best validation loss never improves."""
    d = tmp_path_factory.mktemp("patient") / "archive"
    summary = json.loads(run(d, "--patience", "2").stdout)
    return d, summary, snapshot(d)


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    """The same settings without --patience."""
    d = tmp_path_factory.mktemp("impatient") / "archive"
    summary = json.loads(run(d).stdout)
    return d, summary, snapshot(d)


def test_patience_stops_a_run_whose_best_validation_loss_stalls(patient):
    _, summary, snap = patient
    gens = snap["generations"]
    best_vals = {g[5] for g in gens}
    assert len(best_vals) == 1 and None not in best_vals  # the premise: no gain after generation 0
    # generation 0 sets the best; generations 1 and 2 bring nothing: out of patience after 2
    assert [g[0] for g in gens] == [0, 1, 2]
    assert summary["generations"] == 2 < GENERATIONS
    assert summary["stopped_by_patience"] is True
    assert all(p[1] <= 2 for p in snap["programs"])


def test_without_patience_the_same_settings_run_every_generation(patient, impatient):
    _, summary, snap = impatient
    assert [g[0] for g in snap["generations"]] == list(range(GENERATIONS + 1))
    assert summary["generations"] == GENERATIONS
    assert summary["stopped_by_patience"] is False
    assert len({g[5] for g in snap["generations"]}) == 1  # it did stall all along
    # patience only stops the run: what it ran is what the run without it ran
    assert upto(snap, 2) == patient[2]


def test_a_resumed_run_with_the_same_patience_stops_where_it_stopped(patient, impatient, tmp_path):
    d = tmp_path / "archive"
    shutil.copytree(patient[0], d)
    summary = json.loads(run(d, "--resume", "--patience", "2").stdout)
    assert snapshot(d) == patient[2]  # no new generation
    assert summary["generations"] == 2 and summary["stopped_by_patience"] is True

    # patience is not part of the run's identity: more of it buys exactly one more stalled generation
    summary = json.loads(run(d, "--resume", "--patience", "3").stdout)
    assert [g[0] for g in snapshot(d)["generations"]] == [0, 1, 2, 3]
    assert summary["generations"] == 3 and summary["stopped_by_patience"] is True

    # and without it the run goes on to the end, exactly as the uninterrupted run did
    summary = json.loads(run(d, "--resume").stdout)
    assert summary["generations"] == GENERATIONS and summary["stopped_by_patience"] is False
    assert snapshot(d) == impatient[2]


def test_patience_running_out_at_the_last_generation_stopped_nothing(tmp_path):
    d = tmp_path / "archive"
    summary = json.loads(run(d, "--patience", "2", generations=2).stdout)
    # out of patience after generation 2, but that was the last one anyway
    assert summary["generations"] == 2 and summary["stopped_by_patience"] is False


# ---- the rule, on generations written with chosen best validation losses ----


def test_only_a_gain_of_more_than_half_a_percent_resets_the_patience(synthetic, tmp_path):
    assert PATIENCE_GAIN == 0.005
    a = Archive(tmp_path / "archive", create=True)
    try:
        with ReplayPool(synthetic.experiments, workers=1) as pool:

            def search(patience):
                return Search(a, synthetic, pool, SearchConfig(patience=patience), resume=True)

            first = search(2)
            run_id = first.run_id
            assert not first.out_of_patience()  # nothing completed yet
            # best validation loss after each generation -> out of patience (2, 1, 3) after it
            steps = [
                (100.0, (False, False, False)),  # the first best
                (99.7, (False, True, False)),  # -0.3% from 100: no gain
                (99.4, (False, False, False)),  # -0.6% from 100 (the last gain), though -0.3% from 99.7: a gain
                (99.0, (False, True, False)),  # -0.4% from 99.4: no gain
                (None, (True, True, False)),  # no finite validation loss: no gain
                (98.95, (True, True, True)),  # -0.45% from 99.4 (the reference is the last gain): no gain
                (98.0, (False, False, False)),  # -1.4%: a gain
            ]
            for g, (best_val, expected) in enumerate(steps):
                a.write_generation(run_id, g, 0.0, [], [], [], GenerationRecord(best_val=best_val))
                got = tuple(search(p).out_of_patience() for p in (2, 1, 3))
                assert got == expected, (g, best_val, got)
                assert not search(None).out_of_patience()  # without --patience, never
            assert search(1).summary()["stopped_by_patience"] is False  # the last generation was a gain
    finally:
        a.close()


def test_exactly_half_a_percent_is_not_a_gain(synthetic, tmp_path):
    for second, out in ((100.0 * (1 - PATIENCE_GAIN), True), (100.0 * (1 - PATIENCE_GAIN) - 1e-6, False)):
        a = Archive(tmp_path / str(second), create=True)
        try:
            with ReplayPool(synthetic.experiments, workers=1) as pool:
                config = SearchConfig(patience=1, generations=5)
                run_id = Search(a, synthetic, pool, config).run_id
                for g, v in enumerate((100.0, second)):
                    a.write_generation(run_id, g, 0.0, [], [], [], GenerationRecord(best_val=v))
                s = Search(a, synthetic, pool, config, resume=True)  # reads the generations back
                assert s.out_of_patience() is out
                assert s.summary()["stopped_by_patience"] is out
        finally:
            a.close()


# ---- archives stored before fit_method, objective and weights were settings ----


def make_legacy(archive_dir):
    """Drop the settings an old archive did not store from its run's stored search settings."""
    db = sqlite3.connect(archive_dir / Archive.FILE)
    run_id, config = db.execute("SELECT id, config FROM runs").fetchone()
    config = json.loads(config)
    for k in LEGACY_SETTINGS:
        config["search"].pop(k, None)  # (cv_fit_evals is stored only with --cv)
    db.execute("UPDATE runs SET config=? WHERE id=?", (json.dumps(config), run_id))
    db.commit()
    db.close()
    return config


def _without(args: list[str], *flags: str) -> list[str]:
    """`args` without each of `flags` and its value."""
    out, skip = [], False
    for a in args:
        if skip or a in flags:
            skip = not skip
            continue
        out.append(a)
    return out


def test_a_legacy_archive_resumes_with_fit_method_cmaes_and_only_with_it(tmp_path):
    d = tmp_path / "archive"
    run(d, generations=0)
    config = make_legacy(d)
    assert "fit_method" not in config["search"] and "objective" not in config["search"]
    before = snapshot(d)
    assert LEGACY_SETTINGS["fit_method"] == "cmaes"

    base = [
        "run",
        "--generations",
        "1",
        "--seed",
        "5",
        "--archive",
        str(d),
        "--resume",
        *_without(STALL, "--fit-method", "--seed-program-starts"),  # the hint below names the starts
    ]
    res = CliRunner().invoke(app, base)  # the default method is trust-region; the old run fitted with CMA-ES
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.stderr
    assert "fit-method: run cmaes, now trust-region" in errors[0] and str(d) in errors[0], errors[0]
    assert "--fit-method cmaes" in errors[0].rsplit("(", 1)[1], errors[0]  # the flag that gives it
    assert "objective" not in errors[0] and "weights" not in errors[0]  # the legacy values of those match

    res = CliRunner().invoke(app, [*base, "--fit-method", "cmaes", "--objective", "worst3"])
    assert res.exit_code == 2 and "objective: run rms, now worst3" in res.stderr, res.output
    assert snapshot(d) == before  # nothing ran

    # units and prompt reuse are legacy settings too: such a run checked no units and shared system prompts only
    res = CliRunner().invoke(app, [*base, "--fit-method", "cmaes", "--units", "off"])
    assert res.exit_code == 2 and "prompt-reuse: run system-prompt, now detect" in res.stderr, res.output
    legacy = [*base, "--fit-method", "cmaes", "--units", "off", "--prompt-reuse", "system-prompt"]
    res = CliRunner().invoke(app, legacy)  # and the trust region of a promoted child's fit
    assert res.exit_code == 2, res.output
    assert "full-fit-candidates: run 3, now 1; full-fit-surrogate: run None, now 60" in res.stderr, res.output
    assert "quick-surrogate: run None, now 80" in res.stderr, res.output  # the screening fits' budget before 80
    # the error ends with the flags that give the run's settings, and they resume it
    hint = res.stderr.strip().rsplit("(", 1)[1].rstrip(")").split()
    pairs = dict(zip(hint[::2], hint[1::2]))
    assert pairs == {
        "--quick-surrogate": "0",
        "--full-fit-candidates": "3",
        "--full-fit-surrogate": "0",
        "--time-components": "free",  # a run stored before the setting kept no components
        "--unexercised": "allow",  # nor kept out terms the data cannot judge
        "--physics": "off",  # nor held its programs to the floor
        "--residual": "0.0",  # nor proposed terms screened on its residuals
        "--residual-refit": "never",  # nor beside its refitted constants
        "--seed-program-starts": "1",  # and fitted each seed from one start
    }, hint
    res = CliRunner().invoke(app, [*legacy, *hint, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["generations"] == 1
    after = snapshot(d)
    assert upto(after, 0) == before and [g[0] for g in after["generations"]] == [0, 1]
