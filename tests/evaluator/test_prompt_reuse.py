"""Prompt reuse: the loader finds a cycled prompt list in the per-request input lengths and gives
each request its prompt (prompt_reuse.py); `--prompt-reuse` picks the policy, `data check` shows
what was found, fits and runs store it; data without a cycle are left as they were."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import needs_real_data
from typer.testing import CliRunner

from stepml_evolve.evaluator.data.experiment_reader import load_experiment
from stepml_evolve.evaluator.data.experiments import LoadOptions
from stepml_evolve.evaluator.data.prompt_reuse import Sharing, assign_prompts, detect_cycle, expected_cached_share
from stepml_evolve.evolve.cli.app import app


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def cycled(period=37, rounds=6, seed=1, swaps=()):
    """Input lengths of a list of `period` prompts sent in turn; `swaps`: positions i whose send
    changed places with i + 1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(500, 530, period)
    slot = np.arange(period * rounds) % period
    for i in swaps:
        slot[i], slot[i + 1] = slot[i + 1], slot[i]
    return lengths[slot], slot


# ---- finding the cycle ----------------------------------------------------------------------------


def test_a_cycled_list_is_found_and_swapped_sends_get_their_own_prompt():
    swaps = (40, 100, 151)
    x, slot = cycled(swaps=swaps)
    known = np.ones(len(x), bool)
    cycle = detect_cycle(x, known)
    assert cycle.period == 37 and cycle.share > 0.9 and cycle.chance < 0.2
    a = assign_prompts(x, known, cycle.period)
    # a swapped send whose length tells it apart is matched to the prompt it sent
    tell = [i for i in swaps if x[i] != x[i + 1]]
    assert tell and all(a.prompt[i] == slot[i] and a.prompt[i + 1] == slot[i + 1] for i in tell)
    assert a.n_swapped == 2 * len(tell) and a.n_unmatched == 0
    assert (a.prompt < 37).all() and (a.lengths == x).all()


def test_lengths_that_show_no_cycle_give_none():
    rng = np.random.default_rng(2)
    known = np.ones(600, bool)
    assert detect_cycle(rng.integers(500, 530, 600), known) is None  # random lengths
    assert detect_cycle(np.full(600, 512), known) is None  # one length: nothing tells prompts apart
    x, _ = cycled(period=300, rounds=1)
    assert detect_cycle(x, np.ones(300, bool)) is None  # the list was sent once: no repeat to see
    assert detect_cycle(np.repeat(rng.integers(500, 530, 60), 10), known) is None  # constant stretches, no list


def test_a_request_without_a_length_gets_its_slot_s_prompt_and_one_that_fits_no_prompt_its_own():
    x, slot = cycled(period=20, rounds=5)
    known = np.ones(len(x), bool)
    known[[5, 47]] = False  # failed requests record no length
    x = x.copy()
    x[[5, 47]] = 0
    x[60] = 9999  # a length no nearby prompt has
    a = assign_prompts(x, known, 20)
    assert a.n_imputed == 2 and a.lengths[5] == x[25] and a.lengths[47] == x[27]
    assert a.prompt[5] == 5 and a.prompt[47] == 7
    assert a.n_unmatched == 1 and a.prompt[60] >= 20 and (a.prompt == a.prompt[60]).sum() == 1


def test_expected_cached_share_counts_full_blocks_and_the_last_token():
    inputs = np.array([40, 40, 40, 48])
    # prompts 0, 0, 1 (of one group with a 20-token prefix: one full block), then 2 alone
    sharing = Sharing(np.array([0, 0, 1, 2]), np.array([0, 0, 0, -1]), (20,))
    # the resend: (40 - 1) // 16 = 2 blocks, 32 tokens; prompt 1: its group's one block, 16 tokens
    assert expected_cached_share(inputs, sharing, 16) == pytest.approx((32 + 16) / 168)


# ---- the real data --------------------------------------------------------------------------------


@needs_real_data
def test_every_real_run_cycles_100_prompts_and_the_cache_serves_most_prompt_tokens(real_experiments):
    for e in real_experiments:
        r = e.prompt_reuse
        assert (r.model, r.period) == ("cycle", 100), e.name
        assert r.share_matched >= 0.975 and r.n_unmatched <= 5 and r.cached_share > 0.97, (e.name, r)
        assert len(set(e.prompt[e.prompt < 100].tolist())) == 100
        # a failed request (no length recorded) has its prompt's length, from the cycle
        assert r.n_imputed == e.n_imputed_inputs >= e.n_failed - 4
        slot = np.arange(e.n_requests) % 100
        same = e.prompt == slot
        assert same.mean() > 0.97
        # every prompt has one length; prompts of one system prompt share its blocks
        assert len(set(zip(e.prompt.tolist(), e.input_tokens.tolist()))) == len(set(e.prompt.tolist()))
        assert set(e.group_tokens) <= {100, 150}


@needs_real_data
def test_the_replay_serves_resent_prompts_from_the_cache_unless_kv_binds(real_data, real_experiments):
    from stepml_evolve.evaluator.dsl import compile_program, load_program
    from stepml_evolve.evaluator.replay.closed_loop import replay
    from stepml_evolve.seeds import seed_path

    prog = load_program(seed_path("roofline"))
    cp, c = compile_program(prog), np.array(list(prog.constants.values()))
    codegen = next(e for e in real_experiments if "7b-tp1-codegen" in e.name)
    res = replay(codegen, cp, c, semantics="vllm")
    assert 0.95 < res.cached_share <= codegen.prompt_reuse.cached_share + 1e-4  # (the report rounds to 4 places)
    # system prompts only: a small share, as before this model
    old = load_experiment(real_data / codegen.name, LoadOptions(prompt_reuse="system-prompt"))
    assert replay(old, cp, c, semantics="vllm").cached_share < 0.2
    off = load_experiment(real_data / codegen.name, LoadOptions(prompt_reuse="off"))
    assert replay(off, cp, c).cached_tokens == 0


# ---- the command line -----------------------------------------------------------------------------


def test_data_check_shows_the_cycle_and_the_policy_changes_it(synthetic):
    from stepml_evolve.evaluator.datasets import sample_size
    from stepml_evolve.evaluator.known_truth.synthetic_sample import SAMPLE_SIZES

    period = SAMPLE_SIZES[sample_size()].n_prompts  # the prompt list the generator cycled
    res = cli("data", "check", "--json")
    assert res.exit_code == 0, res.output
    for e in json.loads(res.stdout)["experiments"]:
        r = e["prompt_reuse"]
        assert r["policy"] == "detect" and r["model"] == "cycle" and r["period"] == period
        assert 0.9 < r["share_matched"] <= 1 and r["cached_share"] > 0.85
    res = cli("data", "check", "--json", "--prompt-reuse", "system-prompt")
    shares = [e["prompt_reuse"]["cached_share"] for e in json.loads(res.stdout)["experiments"]]
    assert all(0 < s < 0.3 for s in shares)
    res = cli("data", "check", "--json", "--prompt-reuse", "off")
    assert {e["prompt_reuse"]["model"] for e in json.loads(res.stdout)["experiments"]} == {"none"}
    table = cli("data", "check")
    assert f"cycle {period}" in table.stdout and "cached %" in table.stdout
    bad = cli("data", "check", "--prompt-reuse", "sometimes")
    assert bad.exit_code == 2 and "sometimes" in bad.output


def test_lengths_without_a_cycle_are_replayed_as_before_and_data_check_says_so(synthetic, tmp_path):
    src = synthetic.directory / synthetic.experiments[1].name
    dst = tmp_path / "shuffled"
    shutil.copytree(src, dst)
    meta = json.loads((dst / "requests.json").read_text())
    rng = np.random.default_rng(0)
    lengths = [r["input_tokens"] for r in meta["requests"]]
    for r, n in zip(meta["requests"], rng.permutation(lengths)):
        r["input_tokens"] = int(n)
    (dst / "requests.json").write_text(json.dumps(meta))
    e = load_experiment(dst)
    assert e.prompt_reuse.model == "system-prompt" and "no cycle" in e.prompt_reuse.note
    assert len(set(e.prompt.tolist())) == e.n_requests
    res = cli("data", "check", "--data", dst, "--json")
    (row,) = json.loads(res.stdout)["experiments"]
    assert row["prompt_reuse"]["model"] == "system-prompt" and row["prompt_reuse"]["period"] is None


def test_fit_stores_the_policy_in_its_header_and_its_json(tmp_path):
    from stepml_evolve.evaluator.fit.fitted_header import FittedHeader
    from stepml_evolve.seeds import seed_path

    out = tmp_path / "rf.py"
    res = cli(
        "fit", seed_path("roofline"), "--max-evals", "4", "--prompt-reuse", "system-prompt", "--out", out, "--json"
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["prompt_reuse"] == "system-prompt"
    assert FittedHeader.parse(out.read_text()).prompt_reuse == "system-prompt"


def test_a_recorded_group_with_two_lengths_is_one_line_and_the_other_experiments_still_load(synthetic, tmp_path):
    for e in synthetic.experiments[:2]:
        shutil.copytree(synthetic.directory / e.name, tmp_path / e.name)
    bad = tmp_path / synthetic.experiments[0].name
    meta = json.loads((bad / "requests.json").read_text())
    for k, r in enumerate(meta["requests"][:3]):
        r["prefix_group"], r["prefix_length"] = "g", 64 + 16 * (k == 2)
    (bad / "requests.json").write_text(json.dumps(meta))
    res = cli("data", "check", "--data", tmp_path, "--json")
    assert res.exit_code == 2
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and bad.name in errors[0] and "requests.json" in errors[0], res.stderr
    assert "request 2 has prefix_length 80 but group 'g' started with 64" in errors[0]
    assert [e["name"] for e in json.loads(res.stdout)["experiments"]] == [synthetic.experiments[1].name]
