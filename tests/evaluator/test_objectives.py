"""Objectives (evaluator/scoring/objectives.py): rms is the project's loss (`reference_loss`), worst3 is
the mean of the three largest per-experiment APE of mean E2E, weights from a YAML file; and the
CLI options that carry them (`evolve eval/fit/run --objective --weights`)."""

from __future__ import annotations

import json
import math
import sqlite3

import numpy as np
import pytest
from conftest import LEAN, only_error_line
from typer.testing import CliRunner

from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.dsl import compile_program, load_program
from stepml_evolve.evaluator.fit.fitted_header import FittedHeader
from stepml_evolve.evaluator.scoring.metrics import Errors, Means, MetricRow, Timeouts, rms
from stepml_evolve.evaluator.scoring.objectives import DEFAULT, OBJECTIVES, Objective, ObjectiveError, load_objective
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import seed_path

NAN = math.nan


def row(name: str, e2e, ttft, n: int = 10) -> MetricRow:
    m = Means(1.0, 0.1, 10.0)
    return MetricRow(
        name=name,
        split="test",
        n_requests=n,
        observed=m,
        predicted=m,
        ape=Errors(e2e, ttft, 0.0),
        timeouts=Timeouts(0, 0),
    )


def reference_loss(rows: list[MetricRow]) -> float:
    """The loss every figure of this project uses, as it was defined before objectives existed:
    RMS over experiments of APE(mean E2E) + RMS of APE(mean TTFT), skipping unmeasured rows."""
    rows = [r for r in rows if r.n_requests > 0]
    if not rows:
        return math.nan
    return rms(r.ape.e2e for r in rows) + rms(r.ape.ttft for r in rows)


def rms_of(values) -> float:
    v = [x for x in values if not math.isnan(x)]
    return math.sqrt(sum(x * x for x in v) / len(v))


def worst3_of(values) -> float:
    v = sorted((x for x in values if not math.isnan(x)), reverse=True)[:3]
    return sum(v) / len(v)


# ---- the losses ----


def test_rms_unweighted_is_the_reference_loss_exactly_on_random_rows():
    rng = np.random.default_rng(1)
    for trial in range(200):
        n = int(rng.integers(1, 9))
        rows = []
        for i in range(n):
            e2e, ttft = rng.exponential(20.0, 2)
            if rng.random() < 0.15:
                e2e = NAN
            if rng.random() < 0.15:
                ttft = NAN
            rows.append(row(f"exp{i}", float(e2e), float(ttft), n=int(rng.integers(0, 3)) * 5))
        ours, theirs = Objective("rms").of_rows(rows), reference_loss(rows)
        assert (math.isnan(ours) and math.isnan(theirs)) or ours == theirs, (trial, ours, theirs)


def test_rms_unweighted_is_the_reference_loss_exactly_on_replayed_rows(synthetic):
    """Real metric rows of the roofline seed on every split: the default objective changes no figure."""
    program = load_program(seed_path("roofline"))
    start = np.array(list(program.constants.values()), dtype=float)
    with ReplayPool(synthetic.experiments, workers=2) as pool:
        for scale in (1.0, 0.5, 3.0):
            rows = pool.score(program, [start * scale] * len(synthetic.experiments), ("train", "validate", "test"))
            for split, rs in rows.items():
                assert len(rs) == len(synthetic.experiments)
                assert DEFAULT.of_rows(rs) == Objective("rms").of_rows(rs) == reference_loss(rs), (scale, split)
                assert math.isfinite(reference_loss(rs))


def test_worst3_is_the_mean_of_the_three_largest_e2e_apes_and_ignores_ttft():
    rows = [row("a", 10.0, 500.0), row("b", 2.0, 1.0), row("c", 7.0, 0.0), row("d", 4.0, 900.0), row("e", 1.0, 3.0)]
    assert Objective("worst3").of_rows(rows) == pytest.approx((10 + 7 + 4) / 3)
    # order of the rows does not matter
    assert Objective("worst3").of_rows(rows[::-1]) == pytest.approx((10 + 7 + 4) / 3)
    # fewer than three experiments: the mean of those there
    assert Objective("worst3").of_rows(rows[:2]) == pytest.approx(6.0)
    assert Objective("worst3").of_rows(rows[1:2]) == pytest.approx(2.0)
    # it is not the rms loss
    assert Objective("worst3").of_rows(rows) != pytest.approx(reference_loss(rows))


def test_weights_scale_each_ape_before_worst3_ranks_them():
    rows = [row("big-a", 10.0, 0.0), row("big-b", 9.0, 0.0), row("big-c", 8.0, 0.0), row("small", 1.0, 0.0)]
    assert Objective("worst3").of_rows(rows) == pytest.approx(9.0)
    # weight 20 lifts "small" (1 -> 20) into the three worst, pushing out big-c
    assert Objective("worst3", (("small", 20.0),)).of_rows(rows) == pytest.approx((20 + 10 + 9) / 3)
    # weight 0.5 on big-a (10 -> 5) drops it below big-c
    assert Objective("worst3", (("big-a", 0.5),)).of_rows(rows) == pytest.approx((9 + 8 + 5) / 3)


def test_weighted_rms_counts_an_experiment_as_often_as_its_weight():
    """Integer weights: the weighted RMS is the plain RMS with each experiment repeated weight times."""
    rows = [row("llama-7b", 3.0, 2.0), row("llama-70b", 5.0, 1.0), row("mixtral", 11.0, 7.0)]
    goal = Objective("rms", (("mix*", 3.0), ("*70b", 2.0)))
    repeated = [3.0] + [5.0] * 2 + [11.0] * 3, [2.0] + [1.0] * 2 + [7.0] * 3
    assert goal.of_rows(rows) == pytest.approx(rms_of(repeated[0]) + rms_of(repeated[1]))
    assert goal.of_rows(rows) > Objective("rms").of_rows(rows)  # the worst experiment weighs more
    # weights that are all 1 give the unweighted loss back
    assert Objective("rms", (("*", 1.0),)).of_rows(rows) == pytest.approx(reference_loss(rows))
    # scaling every weight by the same factor changes nothing
    assert Objective("rms", (("mix*", 30.0), ("*", 10.0))).of_rows(rows) == pytest.approx(
        Objective("rms", (("mix*", 3.0),)).of_rows(rows)
    )


def test_first_matching_pattern_wins_and_unmatched_weigh_one():
    goal = Objective("rms", (("synth-*", 2.0), ("*mixtral*", 5.0)))
    assert goal.weight("synth-mixtral-8x7b") == 2.0  # both match: the first wins
    assert goal.weight("real-mixtral-8x7b") == 5.0
    assert goal.weight("llama") == 1.0
    assert Objective("rms", (("*mixtral*", 5.0), ("synth-*", 2.0))).weight("synth-mixtral-8x7b") == 5.0
    # fnmatch is case-sensitive here (experiment names are)
    assert Objective("rms", (("*Mixtral*", 5.0),)).weight("synth-mixtral") == 1.0


def test_rows_without_requests_and_nan_apes_are_skipped_inf_makes_the_loss_inf():
    base = [row("a", 4.0, 3.0), row("b", 2.0, 1.0)]
    empty = row("empty", math.inf, math.inf, n=0)  # measures nothing: skipped even with an infinite APE
    for name in OBJECTIVES:
        goal = Objective(name)
        assert goal.of_rows(base + [empty]) == goal.of_rows(base)
        assert goal.of_rows(base + [row("nan", NAN, NAN)]) == pytest.approx(goal.of_rows(base))
        assert goal.of_rows(base + [row("failed", math.inf, math.inf)]) == math.inf
        assert math.isnan(goal.of_rows([empty]))
        assert math.isnan(goal.of_rows([]))
        assert math.isnan(goal.of_rows([row("nan", NAN, NAN)]))
    weighted = Objective("rms", (("a", 2.0),))
    assert weighted.of_rows(base + [empty]) == weighted.of_rows(base)
    assert weighted.of_rows(base + [row("failed", math.inf, 1.0)]) == math.inf
    # APEs read back from an archive are None where undefined: same as NaN
    assert Objective("rms").of_rows(base + [row("none", None, None)]) == pytest.approx(reference_loss(base))


def test_of_apes_scores_a_population_row_by_row_as_of_rows_does():
    rng = np.random.default_rng(5)
    names = ["synth-a", "synth-b", "mixtral-c", "d"]
    e2e, ttft = rng.exponential(10.0, (6, 4)), rng.exponential(10.0, (6, 4))
    e2e[2, 1] = NAN
    ttft[3, 0] = NAN
    e2e[4, 3] = math.inf
    for goal in (
        Objective("rms"),
        Objective("worst3"),
        Objective("rms", (("mix*", 4.0),)),
        Objective("worst3", (("synth-b", 0.25),)),
    ):
        losses = goal.of_apes(names, e2e, ttft)
        assert losses.shape == (6,)
        for p in range(6):
            expected = goal.of_rows([row(n, float(a), float(b)) for n, a, b in zip(names, e2e[p], ttft[p])])
            assert losses[p] == pytest.approx(expected) or (math.isinf(losses[p]) and math.isinf(expected))
        assert math.isinf(losses[4])
    # a single (E,) row is a population of one
    assert Objective("worst3").of_apes(names, e2e[0], ttft[0]).tolist() == pytest.approx([worst3_of(e2e[0])])


def test_engine_population_losses_use_the_objective(synthetic):
    program = load_program(seed_path("roofline"))
    start = np.array(list(program.constants.values()), dtype=float)
    pop = [start, start * 2.0]
    goal = Objective("worst3", (("*mixtral*", 3.0),))
    with ReplayPool(synthetic.experiments, workers=2) as pool:
        losses = pool.population_losses(compile_program(program), pop, synthetic.experiments, "train", goal)
        for vec, got in zip(pop, losses):
            rows = pool.score(program, [vec] * len(synthetic.experiments), ("train",))["train"]
            expected = worst3_of([r.ape.e2e * (3.0 if "mixtral" in r.name else 1.0) for r in rows if r.n_requests])
            assert got == pytest.approx(expected)


def test_an_unknown_objective_is_refused():
    with pytest.raises(ObjectiveError, match="worst3"):
        Objective("worst5")
    with pytest.raises(ObjectiveError):
        load_objective("mean", None)


# ---- weights files ----

EXPERIMENTS = ["synth-codellama-34b-tp2-reasoning", "synth-llama-2-70b-tp4-codegen", "synth-mixtral-8x7b-tp2-roleplay"]


def test_load_objective_reads_patterns_in_file_order(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text('"*mixtral*": 3\n"synth-*": 0.5\n"*70b*": 2.5\n')
    goal = load_objective("worst3", f, EXPERIMENTS)
    assert goal.name == "worst3"
    assert goal.weights == (("*mixtral*", 3.0), ("synth-*", 0.5), ("*70b*", 2.5))
    assert all(isinstance(w, float) for _, w in goal.weights)
    assert [goal.weight(e) for e in EXPERIMENTS] == [0.5, 0.5, 3.0]  # synth-* comes before *70b*
    assert goal.settings() == {"objective": "worst3", "weights": [["*mixtral*", 3.0], ["synth-*", 0.5], ["*70b*", 2.5]]}
    assert load_objective("rms", None, EXPERIMENTS) == Objective("rms")
    assert Objective("rms").settings() == {"objective": "rms", "weights": None}
    # without the experiments, patterns are not checked against them
    assert load_objective("rms", f).weights == goal.weights


@pytest.mark.parametrize(
    "text, says",
    [
        ('"*mixtral*": 2\n"*gpt*": 3\n', "'*gpt*' matches no experiment"),
        ('"*mixtral*": 0\n', "positive number"),
        ('"*mixtral*": -1.5\n', "positive number"),
        ('"*mixtral*": two\n', "positive number"),
        ('"*mixtral*": "2"\n', "positive number"),
        ('"*mixtral*": true\n', "positive number"),
        ('"*mixtral*": .nan\n', "positive number"),
        ('"*mixtral*": .inf\n', "positive number"),
        ('"*mixtral*": [1, 2]\n', "positive number"),
        ('"*mixtral*": ' + "9" * 400 + "\n", "positive number"),  # an int no float holds
        ('"*mixtral*": [1, 2\n', "not valid YAML"),
        ("\t- : :\n", "not valid YAML"),
        ("", "expected a mapping"),
        ("- '*mixtral*'\n- 2\n", "expected a mapping"),
        ("just a string\n", "expected a mapping"),
    ],
)
def test_bad_weights_files_are_one_line_errors_naming_the_file(tmp_path, text, says):
    f = tmp_path / "weights.yaml"
    f.write_text(text)
    with pytest.raises(ObjectiveError) as e:
        load_objective("rms", f, EXPERIMENTS)
    message = str(e.value)
    assert message.startswith(f"{f}: ") and says in message, message
    assert "\n" not in message


def test_unreadable_weights_files_are_one_line_errors_naming_the_file(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x81 not text")
    for path in (tmp_path / "missing.yaml", tmp_path, binary):
        with pytest.raises(ObjectiveError) as e:
            load_objective("worst3", path, EXPERIMENTS)
        assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value), str(e.value)


# ---- the command line ----


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def weights_file(tmp_path):
    f = tmp_path / "weights.yaml"
    f.write_text('"*mixtral*": 4\n"*7b*": 0.5\n')
    return f


def weight_of(name: str) -> float:  # what weights_file says
    return 4.0 if "mixtral" in name else 0.5 if "7b" in name else 1.0


def test_eval_reports_the_weighted_worst3_loss(weights_file):
    res = invoke("eval", seed_path("roofline"), "--objective", "worst3", "--weights", weights_file, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["objective"] == "worst3"
    assert out["weights"] == [["*mixtral*", 4.0], ["*7b*", 0.5]]
    rows = [r for r in out["experiments"] if r["n_requests"] > 0]
    assert len(rows) >= 3  # worst3 needs three; the overloaded scenario has no success in its test window
    expected = worst3_of([r["ape"]["e2e"] * weight_of(r["name"]) for r in rows])
    assert out["loss"] == pytest.approx(expected, rel=1e-12)

    plain = json.loads(invoke("eval", seed_path("roofline"), "--json").stdout)
    assert plain["objective"] == "rms" and plain["weights"] is None
    assert plain["loss"] == pytest.approx(
        rms_of([r["ape"]["e2e"] for r in rows]) + rms_of([r["ape"]["ttft"] for r in rows])
    )
    assert plain["experiments"] == out["experiments"]  # the objective changes the loss, not the replay

    text = invoke("eval", seed_path("roofline"), "--objective", "worst3", "--weights", weights_file)
    assert text.exit_code == 0, text.output
    line = next(ln for ln in text.stdout.splitlines() if ln.startswith("loss (test):"))
    assert f"{expected:.3f}" in line and "3 worst" in line and "*mixtral*=4" in line, line


def test_fit_with_worst3_weights_and_cmaes_says_so_in_json_and_header(tmp_path, weights_file):
    out_path = tmp_path / "rf.fitted.py"
    res = invoke(
        "fit",
        seed_path("roofline"),
        "--max-evals",
        6,
        "--objective",
        "worst3",
        "--weights",
        weights_file,
        "--method",
        "cmaes",
        "--out",
        out_path,
        "--json",
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["method"] == "cmaes" and out["objective"] == "worst3"
    assert out["weights"] == [["*mixtral*", 4.0], ["*7b*", 0.5]]
    for split, scored in out["splits"].items():  # validate and test are scored with the same objective
        rows = [r for r in scored["experiments"] if r["n_requests"] > 0]
        assert scored["loss"] == pytest.approx(worst3_of([r["ape"]["e2e"] * weight_of(r["name"]) for r in rows])), split
    header = FittedHeader.parse(out_path.read_text())
    assert header is not None
    assert header.method == "cmaes" and header.objective == "worst3+weights"
    assert header.train_loss == pytest.approx(out["train_loss"], abs=1e-4)
    first = out_path.read_text().splitlines()[0]
    assert " method=cmaes " in first and " objective=worst3+weights " in first, first


def test_fit_header_names_only_settings_that_are_not_the_default(tmp_path, weights_file):
    weighted, plain, worst = tmp_path / "w.py", tmp_path / "p.py", tmp_path / "x.py"
    for path, extra in ((weighted, ["--weights", weights_file]), (plain, []), (worst, ["--objective", "worst3"])):
        res = invoke("fit", seed_path("roofline"), "--max-evals", 3, "--out", path, "--json", *extra)
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["method"] == "trust-region"
    first = {p: p.read_text().splitlines()[0] for p in (weighted, plain, worst)}
    assert " objective=rms+weights " in first[weighted] and "method=" not in first[weighted], first[weighted]
    assert "objective=" not in first[plain] and "method=" not in first[plain], first[plain]
    assert " objective=worst3 " in first[worst], first[worst]
    assert FittedHeader.parse(weighted.read_text()).objective == "rms+weights"
    assert FittedHeader.parse(plain.read_text()).objective == "rms"
    assert FittedHeader.parse(worst.read_text()).objective == "worst3"


@pytest.mark.parametrize(
    "content, says",
    [
        ('"*gpt-5*": 2\n', "matches no experiment"),
        ('"*mixtral*": -2\n', "positive number"),
        ('"*mixtral*": [2\n', "not valid YAML"),
        (None, "cannot read"),
    ],
)
def test_a_bad_weights_file_stops_every_command_with_one_line(tmp_path, content, says):
    f = tmp_path / "weights.yaml"
    if content is not None:
        f.write_text(content)
    program = seed_path("roofline")
    only_error_line(invoke("eval", program, "--weights", f), str(f), says)
    only_error_line(invoke("fit", program, "--weights", f, "--out", tmp_path / "o.py"), str(f), says)
    only_error_line(
        invoke("run", "--generations", 0, "--archive", tmp_path / "run", "--weights", f, "--seed-program-fit-evals", 3),
        str(f),
        says,
    )
    assert not (tmp_path / "o.py").exists() and not (tmp_path / "run").exists()


def test_an_unknown_objective_is_a_usage_error():
    res = invoke("eval", seed_path("roofline"), "--objective", "worst5")
    assert res.exit_code == 2 and "--objective" in res.stderr and "Traceback" not in res.output


RUN = ["--fit-method", "cmaes", "--seed-program-fit-evals", 6, "--children", 2, *LEAN]


def stored_search(archive_dir) -> dict:
    db = sqlite3.connect(archive_dir / Archive.FILE)
    (config,) = db.execute("SELECT config FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    db.close()
    return json.loads(config)["search"]


def test_run_stores_objective_and_weights_and_resume_must_match(tmp_path, weights_file):
    d = tmp_path / "run"
    res = invoke(
        "run", "--generations", 0, "--archive", d, "--objective", "worst3", "--weights", weights_file, *RUN, "--json"
    )
    assert res.exit_code == 0, res.output
    search = stored_search(d)
    assert search["objective"] == "worst3"
    assert search["weights"] == [["*mixtral*", 4.0], ["*7b*", 0.5]]
    assert "patience" not in search  # may change on resume

    # the programs' losses are the objective's: val_loss is the weighted worst3 of the stored validate rows
    a = Archive(d)
    try:
        seeds = [p for p in a.programs(a.run().id) if p.full]
        assert seeds
        for p in seeds:
            rows = [r for r in a.metric_rows(p.id, "validate") if r.n_requests > 0]
            assert p.val_loss == pytest.approx(worst3_of([r.ape.e2e * weight_of(r.name) for r in rows]))
    finally:
        a.close()

    # the same weights (another file, same content): accepted
    same = tmp_path / "same.yaml"
    same.write_text(weights_file.read_text())
    res = invoke(
        "run", "--generations", 0, "--archive", d, "--resume", "--objective", "worst3", "--weights", same, *RUN
    )
    assert res.exit_code == 0, res.output

    other = tmp_path / "other.yaml"
    other.write_text('"*mixtral*": 2\n"*7b*": 0.5\n')
    for extra, says in (
        (["--objective", "worst3", "--weights", other], "weights: run"),
        (["--objective", "worst3"], "weights: run"),
        (["--weights", weights_file], "objective: run worst3, now rms"),
        (
            ["--objective", "worst3", "--weights", weights_file, "--prompt-reuse", "off"],
            "prompt-reuse: run detect, now off",
        ),
    ):
        res = invoke("run", "--generations", 1, "--archive", d, "--resume", *extra, *RUN)
        only_error_line(res, str(d), "other search settings", says)
    assert stored_search(d) == search
    a = Archive(d)
    try:
        assert a.last_generation(a.run().id) == 0  # nothing ran under other settings
    finally:
        a.close()
