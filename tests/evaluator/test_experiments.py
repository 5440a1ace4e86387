"""Experiment loading: the data caveats, the temporal split, and one-line errors for bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import needs_real_data
from typer.testing import CliRunner

from stepml_evolve.evaluator.data.experiment_reader import load_experiment, load_experiments
from stepml_evolve.evaluator.data.experiments import ExperimentError, LoadOptions
from stepml_evolve.evolve.cli.app import app

REAL_PROFILE_OUTPUT_LENS = {247, 248, 251, 1448}


@needs_real_data
def test_observed_means_match_inference_perf_summary_on_all_16(real_experiments):
    assert len(real_experiments) == 16
    for e in real_experiments:
        ours = e.observed_means()
        assert e.summary is not None, e.name
        for key in ("e2e_mean_s", "ttft_mean_s"):
            assert ours[key] == pytest.approx(e.summary[key], rel=1e-3), (e.name, key)


@needs_real_data
def test_output_length_comes_from_profile_because_server_ignored_eos(real_experiments):
    for e in real_experiments:
        assert e.output_len_used in REAL_PROFILE_OUTPUT_LENS
        assert (e.output_tokens == e.output_len_used).all()
    llama7 = next(e for e in real_experiments if "7b-tp1-codegen" in e.name)
    ok = ~llama7.failed
    # the client's re-tokenized counts disagree with what the server generated
    assert (llama7.reported_output_tokens[ok] < llama7.output_len_used).mean() > 0.3


@needs_real_data
def test_reported_output_policy_uses_client_counts(real_data):
    e = load_experiment(real_data / "20260217-155451-llama-2-7b-tp1-codegen", LoadOptions(output_len="reported"))
    assert e.output_len_used is None
    assert np.array_equal(e.output_tokens, np.maximum(e.reported_output_tokens, 1))


@needs_real_data
def test_failed_requests_are_client_timeouts_kept_with_their_observed_time(real_experiments):
    e = next(x for x in real_experiments if "7b-tp1-reasoning" in x.name)
    assert e.n_failed == 4068
    f = e.failed
    np.testing.assert_array_equal(e.abort_after_us[f], np.round(e.e2e_s[f] * 1e6).astype(np.int64))
    assert (e.abort_after_us[f] >= 300e6).all()
    assert (e.abort_after_us[~f] == 300_000_000).all()  # the client timeout, inferred from failures
    # failed requests recorded 0 input tokens: imputed from successful ones
    assert e.n_imputed_inputs == 4068
    assert (e.input_tokens[f] >= 1000).all()
    # failures are excluded from the observed means
    assert e.observed_means()["e2e_mean_s"] == pytest.approx(e.e2e_s[~f].mean())


@needs_real_data
def test_system_prompt_policy_shares_each_group_s_system_prompt_and_hits_its_full_blocks(real_data):
    """--prompt-reuse system-prompt: the replay's model before cycles were detected (each request's
    question its own, groups dealt in turn)."""
    import numpy as np

    from stepml_evolve.evaluator.dsl import compile_program, load_program
    from stepml_evolve.evaluator.replay.closed_loop import replay
    from stepml_evolve.seeds import seed_path

    def load(name):
        return load_experiment(real_data / name, LoadOptions(prompt_reuse="system-prompt"))

    codegen = load("20260217-155451-llama-2-7b-tp1-codegen")  # system prompt 100, 11 groups
    assert codegen.group_tokens == (100,) * 11 and codegen.prompt_reuse.model == "system-prompt"
    assert list(codegen.prefix_group[:12]) == list(range(11)) + [0]  # each group's first request comes first
    assert len(set(codegen.prompt.tolist())) == codegen.n_requests  # no prompt is sent twice
    roleplay = load("20260217-162547-llama-2-7b-tp1-roleplay")  # system prompt 150, 10 groups
    assert roleplay.group_tokens == (150,) * 10 and roleplay.prefix_group.max() == 9
    assert (roleplay.input_tokens[roleplay.prefix_group >= 0] > 150).all()
    # replayed, the first request of each group computes its whole prompt; the rest hit the 6 full blocks
    prog = load_program(seed_path("roofline"))
    t = replay(
        codegen, compile_program(prog), np.array(list(prog.constants.values())), record=True, semantics="vllm"
    ).trajectory
    first = {int(r): i for i, r in reversed(list(enumerate(t.request)))}
    assert [int(t.context[first[r]]) for r in range(11)] == [0] * 11
    assert {int(t.context[first[r]]) for r in range(200, 300)} == {96}


@needs_real_data
def test_temporal_split_is_by_arrival_60_20_20_and_configurable(real_data, real_experiments):
    e = next(x for x in real_experiments if "7b-tp1-general" in x.name)
    assert e.split_sizes() == {"train": 10080, "validate": 3360, "test": 3360}
    assert np.all(np.diff(e.split) >= 0)  # train, then validate, then test in arrival order
    assert e.arrival_us[e.split == 0].max() <= e.arrival_us[e.split == 1].min()
    e2 = load_experiment(real_data / e.name, LoadOptions(split=(0.5, 0.25)))
    assert e2.split_sizes() == {"train": 8400, "validate": 4200, "test": 4200}


def test_synthetic_sample_loads_and_is_labeled(synthetic):
    assert synthetic.synthetic and "synthetic" in synthetic.label
    assert len(synthetic.experiments) == 4 and not synthetic.errors
    assert {e.arch.moe for e in synthetic.experiments} == {True, False}
    assert all(e.synthetic for e in synthetic.experiments)
    assert any(e.n_failed > 0 for e in synthetic.experiments)  # an overloaded run with timeouts


def test_data_synth_writes_the_sample_in_the_replay_format(tmp_path, synthetic):
    res = CliRunner().invoke(app, ["data", "synth", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    good, bad = load_experiments(tmp_path)
    assert not bad and [e.name for e in good] == [e.name for e in synthetic.experiments]
    for mine, ref in zip(good, synthetic.experiments):
        np.testing.assert_array_equal(mine.arrival_us, ref.arrival_us)
        np.testing.assert_array_equal(mine.e2e_s, ref.e2e_s)
        assert mine.observed_means() == pytest.approx(mine.summary, rel=1e-9)
    other = tmp_path / "seed1"
    CliRunner().invoke(app, ["data", "synth", "--out", str(other), "--seed", "1"])
    assert not np.array_equal(load_experiments(other)[0][0].arrival_us, good[0].arrival_us)


# ---- bad input: one-line error naming the experiment, others still reported ----


def _copy_experiment(src, dst):
    dst.mkdir(parents=True)
    for name in ("requests.json", "ground_truth.json", "profile.json"):
        shutil.copy(src / name, dst / name)


def _edit(path, fn):
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def _bad_cases(src, root):
    """Make one good experiment and one bad experiment per defect; returns expected messages."""
    _copy_experiment(src, root / "a-good")
    cases = {}
    d = root / "b-missing-file"
    _copy_experiment(src, d)
    (d / "ground_truth.json").unlink()
    cases[d.name] = "missing file ground_truth.json"
    d = root / "c-malformed"
    _copy_experiment(src, d)
    (d / "requests.json").write_text('{"requests": [1, 2,')
    cases[d.name] = "requests.json: malformed JSON"
    d = root / "d-truth-mismatch"
    _copy_experiment(src, d)
    _edit(d / "ground_truth.json", lambda t: t.pop())
    cases[d.name] = "ground_truth.json has"
    d = root / "e-truth-index"
    _copy_experiment(src, d)
    _edit(d / "ground_truth.json", lambda t: t[3].update(index=999999))
    cases[d.name] = "indices do not match"
    d = root / "f-negative-arrival"
    _copy_experiment(src, d)
    _edit(d / "requests.json", lambda r: r["requests"][5].update(arrival_time_us=-10))
    cases[d.name] = "negative arrival_time_us at request 5"
    d = root / "g-unknown-hardware"
    _copy_experiment(src, d)
    _edit(d / "requests.json", lambda r: r["config"].update(hardware="TPU-v9"))
    cases[d.name] = "unknown hardware 'TPU-v9'"
    d = root / "h-error-flag-mismatch"
    _copy_experiment(src, d)
    _edit(d / "ground_truth.json", lambda t: t[2].update(has_error=True))
    cases[d.name] = "has_error differs"
    d = root / "j-profile-wrong-type"
    _copy_experiment(src, d)
    _edit(d / "profile.json", lambda p: p.update(data=[1]))
    cases[d.name] = "profile.json: data must be an object"
    d = root / "k-huge-input"
    _copy_experiment(src, d)
    _edit(d / "requests.json", lambda r: r["requests"][0].update(input_tokens=10**20))
    cases[d.name] = "input_tokens of record 0 must be an integer"
    d = root / "l-string-flag"
    _copy_experiment(src, d)
    _edit(d / "requests.json", lambda r: r["requests"][4].update(has_error="false"))
    cases[d.name] = "has_error of record 4 must be true or false"
    d = root / "m-string-tokens"
    _copy_experiment(src, d)
    _edit(d / "requests.json", lambda r: r["requests"][2].update(input_tokens="591"))
    cases[d.name] = "input_tokens of record 2 must be an integer"
    d = root / "i-missing-profile"
    _copy_experiment(src, d)
    (d / "profile.json").unlink()
    cases[d.name] = "missing file profile.json"
    return cases


@pytest.fixture
def bad_dir(tmp_path, synthetic):
    src = synthetic.directory / "synth-llama-2-7b-tp1-general"
    return tmp_path, _bad_cases(src, tmp_path)


def test_each_bad_experiment_gets_a_one_line_error_and_the_rest_still_load(bad_dir):
    root, cases = bad_dir
    good, bad = load_experiments(root)
    assert [e.name for e in good] == ["a-good"]
    assert {e.experiment for e in bad} == set(cases)
    for e in bad:
        assert isinstance(e, ExperimentError)
        msg = str(e)
        assert "\n" not in msg and msg.startswith(f"{e.experiment}: ")
        assert cases[e.experiment] in msg, msg


def test_without_profile_the_reported_output_lengths_can_be_asked_for(bad_dir):
    root, _ = bad_dir
    good, bad = load_experiments(root, LoadOptions(output_len="reported"))
    assert "i-missing-profile" in [e.name for e in good]
    assert "i-missing-profile" not in {e.experiment for e in bad}


def test_data_check_cli_reports_good_rows_and_exits_2_on_bad(bad_dir):
    root, cases = bad_dir
    res = CliRunner().invoke(app, ["data", "check", "--data", str(root), "--json"])
    assert res.exit_code == 2
    payload = json.loads(res.stdout)
    assert [r["name"] for r in payload["experiments"]] == ["a-good"]
    assert {r["name"] for r in payload["errors"]} == set(cases)
    error_lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(error_lines) == len(cases)


@needs_real_data
def test_data_check_json_on_real_data_has_the_documented_shape(real_data):
    res = CliRunner().invoke(app, ["data", "check", "--data", str(real_data), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["experiments"]
    assert len(rows) == 16
    for r in rows:
        assert {"name", "model", "tp", "moe", "n_requests", "n_failed", "observed", "split"} <= set(r)
        assert set(r["observed"]) == {"e2e_mean_s", "ttft_mean_s"}
        assert set(r["split"]) == {"train", "validate", "test"}
        assert sum(r["split"].values()) == r["n_requests"]
    moe = {r["name"]: r["moe"] for r in rows}
    assert sum(moe.values()) == 4  # the Mixtral runs
    assert sorted({r["tp"] for r in rows}) == [1, 2, 4]
