"""Cross-validation (evaluator/fit/crossval.py, `evolve cv`) and whole-experiment scoring (`--split all`):
folds hold out what the protocol says and train on the rest only, the held-out experiments are
scored on every request, the CV loss is the objective over the held-out rows, same seed same
numbers, and bad protocols or groups files are refused in one line before any fit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import only_error_line
from typer.testing import CliRunner

from stepml_evolve.evaluator.data.experiments import ALL, SPLITS
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.fit.crossval import FoldError, cross_validate, make_folds
from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants
from stepml_evolve.evaluator.fit.starts import total
from stepml_evolve.evaluator.scoring.objectives import DEFAULT
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import seed_path

SMALL = ["--max-evals", "6"]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def cv_json(*args) -> dict:
    res = invoke("cv", *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("protocol, key", [("lomo", "model"), ("lowo", "workload")])
def test_builtin_protocols_hold_out_one_group_and_train_on_all_others(synthetic, protocol, key):
    exps = synthetic.experiments
    folds = make_folds(protocol, exps)
    groups = {getattr(e, key) for e in exps}
    assert len(folds) == len(groups) >= 2
    held = [n for f in folds for n in f.held_out]
    assert sorted(held) == sorted(e.name for e in exps)  # every experiment held out exactly once
    by_name = {e.name: e for e in exps}
    for f in folds:
        assert len({getattr(by_name[n], key) for n in f.held_out}) == 1
        assert set(f.train) == {e.name for e in exps} - set(f.held_out)


def test_real_lomo_and_lowo_are_four_folds_of_four(real_experiments):
    for protocol in ("lomo", "lowo"):
        folds = make_folds(protocol, real_experiments)
        assert [len(f.held_out) for f in folds] == [4, 4, 4, 4], protocol
        assert all(len(f.train) == 12 for f in folds)


def test_split_all_scores_every_request_and_combines_the_windows(synthetic):
    """The whole experiment's means are the request-weighted means of its three windows."""
    program = load_program(seed_path("roofline"))
    vec = np.array(list(program.constants.values()))
    with ReplayPool(synthetic.experiments, 1) as pool:
        rows = pool.score(program, [vec] * len(synthetic.experiments), SPLITS + (ALL,))
    for i, e in enumerate(synthetic.experiments):
        whole = rows[ALL][i]
        parts = [rows[s][i] for s in SPLITS]
        assert whole.n_requests == int((~e.failed).sum()) == sum(p.n_requests for p in parts)
        for side in ("observed", "predicted"):
            for metric in ("e2e_mean_s", "ttft_mean_s"):
                # a window where every request failed (the overloaded scenario's last one) has no mean
                combined = (
                    sum(getattr(p, side).get(metric) * p.n_requests for p in parts if p.n_requests) / whole.n_requests
                )
                assert getattr(whole, side).get(metric) == pytest.approx(combined, rel=1e-9), (e.name, side, metric)


def test_eval_split_all_cli(tmp_path):
    res = invoke("eval", seed_path("roofline"), "--split", "all", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["split"] == "all" and all(r["split"] == "all" for r in out["experiments"])
    res = invoke("eval", seed_path("roofline"), "--split", "everything")
    assert res.exit_code == 2 and "everything" in res.output


def two_lomo_folds(synthetic, seed: str, fit_seed: int):
    """A seed program, the sample's experiments, its first two LOMO folds and a small fit config."""
    exps = synthetic.experiments
    return load_program(seed_path(seed)), exps, make_folds("lomo", exps)[:2], FitConfig(seed=fit_seed, max_evals=6)


def test_fold_fits_see_only_their_train_experiments(synthetic):
    """A fold's constants are exactly the fit on its train experiments: the held-out one cannot leak in."""
    program, exps, folds, config = two_lomo_folds(synthetic, "roofline", fit_seed=3)
    with ReplayPool(exps, 2) as pool:
        cv = cross_validate(program, exps, pool, "lomo", folds, config)
        for f in cv.folds:
            alone = fit_constants(program, [e for e in exps if e.name in f.fold.train], pool, config)
            assert f.constants == alone.constants["all"], f.fold.name
        everything = fit_constants(program, exps, pool, config)
    assert cv.folds[0].constants != everything.constants["all"]
    assert cv.folds[0].constants != cv.folds[1].constants
    assert cv.loss == pytest.approx(DEFAULT.of_rows(cv.rows))


def test_cv_json_shape_summary_and_loss():
    out = cv_json(seed_path("roofline"), "--protocol", "lowo", "--seed", 1, *SMALL)
    assert out["protocol"] == "lowo" and out["program"].endswith("roofline.py")
    rows = [r for f in out["folds"] for r in f["experiments"]]
    assert len(out["folds"]) == 4 and len(rows) == 4
    for f in out["folds"]:
        assert f["name"] and f["train"] and not set(f["train"]) & {r["name"] for r in f["experiments"]}
        assert all(r["split"] == "all" and r["n_requests"] > 0 for r in f["experiments"])
    for metric in ("e2e", "ttft", "itl"):
        apes = [r["ape"][metric] for r in rows]
        s = out["summary"][metric]
        assert s["mean"] == pytest.approx(np.mean(apes)) and s["max"] == pytest.approx(max(apes))
        assert s["median"] == pytest.approx(np.median(apes))
    e2e, ttft = [r["ape"]["e2e"] for r in rows], [r["ape"]["ttft"] for r in rows]
    rms = lambda v: math.sqrt(sum(x * x for x in v) / len(v))  # noqa: E731
    assert out["loss"] == pytest.approx(rms(e2e) + rms(ttft))


def test_cv_from_several_starts_keeps_each_folds_best_train_fit_and_reports_each_starts_cv_loss(synthetic):
    """starts=N: each fold is fitted from the program's constants and N - 1 prior draws; the fold
    keeps its fit of lowest train loss plus penalties; each start's CV loss is what the folds would
    give had they all kept that start, the first being the one-start CV."""
    program, exps, folds, config = two_lomo_folds(synthetic, "phase_decomposed", fit_seed=2)
    with ReplayPool(exps, 2) as pool:
        one = cross_validate(program, exps, pool, "lomo", folds, config)
        two = cross_validate(program, exps, pool, "lomo", folds, config, starts=2)
    assert one.start_losses == [] and all(f.starts == [] for f in one.folds)
    for f, alone in zip(two.folds, one.folds):
        fits = [fit for fit, _ in f.starts]
        assert fits[0].constants == alone.fit.constants  # the first start is the one-start fit
        assert fits[1].constants != alone.fit.constants
        assert f.fit is fits[min(range(2), key=lambda i: (total(fits[i]), i))]
        assert f.rows == f.starts[fits.index(f.fit)][1]
    assert two.start_losses[0] == pytest.approx(one.loss)
    assert two.loss == pytest.approx(DEFAULT.of_rows(two.rows))
    for k, loss in enumerate(two.start_losses):
        assert loss == pytest.approx(DEFAULT.of_rows([r for f in two.folds for r in f.starts[k][1]]))


def test_cv_starts_on_the_command_line(tmp_path, synthetic):
    names = sorted(e.name for e in synthetic.experiments)
    groups = tmp_path / "groups.yaml"
    groups.write_text(f"a: [{names[0]}]\nb: [{names[1]}]\n")
    args = ["cv", seed_path("roofline"), "--protocol", f"groups:{groups}", "--seed", 1, *SMALL, "--starts", 2]
    out = cv_json(*args[1:])
    assert [len(s["train_losses"]) for s in out["starts"]] == [2, 2]
    assert sorted(f for s in out["starts"] for f in s["kept_by"]) == ["a", "b"]
    for i, f in enumerate(out["folds"]):
        kept = next(s for s in out["starts"] if f["name"] in s["kept_by"])
        assert f["train_loss"] == kept["train_losses"][i]
    for start in out["starts"]:
        assert set(start["summary"]) == set(out["summary"])
        if sorted(start["kept_by"]) == ["a", "b"]:  # kept by every fold: the CV's own rows
            assert start["summary"] == out["summary"]
    res = invoke(*args)
    assert res.exit_code == 0 and "for each of 2 starts:" in res.output, res.output


def test_cv_same_seed_same_numbers_whatever_the_workers():
    a = cv_json(seed_path("trained_physics"), "--protocol", "lomo", "--seed", 5, *SMALL, "--workers", 1)
    b = cv_json(seed_path("trained_physics"), "--protocol", "lomo", "--seed", 5, *SMALL, "--workers", 2)
    assert a == b
    c = cv_json(seed_path("trained_physics"), "--protocol", "lomo", "--seed", 6, *SMALL, "--workers", 2)
    assert c["loss"] != a["loss"]


def test_groups_file_protocol(tmp_path, synthetic):
    names = sorted(e.name for e in synthetic.experiments)
    groups = tmp_path / "groups.yaml"
    groups.write_text(f"first-two: [{names[0]}, {names[1]}]\nlast: {names[3]}\n")
    out = cv_json(seed_path("roofline"), "--protocol", f"groups:{groups}", *SMALL)
    assert [f["name"] for f in out["folds"]] == ["first-two", "last"]
    assert [[r["name"] for r in f["experiments"]] for f in out["folds"]] == [names[:2], [names[3]]]
    assert out["folds"][1]["train"] == names[:3]  # experiments held out by no fold are trained on by all


@pytest.mark.parametrize(
    "text, says",
    [
        ("a: [nope]\n", "fold 'a' names 'nope'"),
        ("a: []\n", "fold 'a' holds out no experiment"),
        ("- x\n- y\n", "expected a mapping"),
        ("a: [\n", "not valid YAML"),
        ("all: ALLNAMES\n", "fold 'all' holds out every experiment"),
    ],
)
def test_bad_groups_files_are_one_line_errors(tmp_path, synthetic, text, says):
    groups = tmp_path / "groups.yaml"
    groups.write_text(text.replace("ALLNAMES", "[" + ", ".join(e.name for e in synthetic.experiments) + "]"))
    before = sorted(tmp_path.iterdir())
    only_error_line(invoke("cv", seed_path("roofline"), "--protocol", f"groups:{groups}"), str(groups), says)
    assert sorted(tmp_path.iterdir()) == before  # nothing written


def test_bad_protocols_are_one_line_errors(tmp_path, synthetic):
    only_error_line(invoke("cv", seed_path("roofline"), "--protocol", "lopo"), "lopo", "lomo, lowo or groups:FILE")
    missing = tmp_path / "none.yaml"
    only_error_line(invoke("cv", seed_path("roofline"), "--protocol", f"groups:{missing}"), str(missing), "cannot read")
    one_model = [e for e in synthetic.experiments][:1]
    with pytest.raises(FoldError, match="one model only"):
        make_folds("lomo", one_model)


def test_real_data_fold_holds_out_a_model(real_data, tmp_path):
    """On the real data, a two-fold groups protocol: each fold's held-out experiments are scored on
    all their requests and the fit trains on the 14 others."""
    groups = tmp_path / "g.yaml"
    groups.write_text(
        "7b-codegen: [20260217-155451-llama-2-7b-tp1-codegen]\n"
        "mixtral-codegen: [20260218-120914-mixtral-8x7b-v0-1-tp2-codegen]\n"
    )
    out = cv_json(seed_path("roofline"), "--protocol", f"groups:{groups}", "--data", real_data, "--max-evals", 2)
    assert [len(f["train"]) for f in out["folds"]] == [15, 15]
    for f in out["folds"]:
        (row,) = f["experiments"]
        assert row["split"] == "all" and row["n_requests"] > 1000 and row["ape"]["e2e"] is not None
    assert math.isfinite(out["loss"])


def test_in_distribution_is_the_plain_fit_scored_on_every_experiment(tmp_path):
    out = cv_json(seed_path("roofline"), "--protocol", "lomo", "--seed", 2, *SMALL, "--in-distribution")
    inside = out["in_distribution"]
    assert sorted(r["name"] for r in inside["experiments"]) == sorted(
        r["name"] for f in out["folds"] for r in f["experiments"]
    )
    res = invoke("fit", seed_path("roofline"), "--seed", 2, *SMALL, "--out", tmp_path / "f.py", "--json")
    assert res.exit_code == 0, res.output
    assert inside["constants"] == json.loads(res.stdout)["constants"]["all"]
    assert all(f["constants"] != inside["constants"] for f in out["folds"])
    assert out["loss"] != inside["loss"]
