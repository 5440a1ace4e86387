"""The closed-loop replay: BLIS timing semantics, scheduler behaviors, and invariants over
random workloads; its per-step components equal the vectorized computation."""

from __future__ import annotations

import numpy as np
import pytest

from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.dsl import compile_program, parse_program, step_times
from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES, coefficients, from_trajectory
from stepml_evolve.evaluator.hardware.model_arch import ModelArch
from stepml_evolve.evaluator.replay.closed_loop import replay
from stepml_evolve.evaluator.replay.state import BAD_STEP_TIME, FINISHED, OK, TIMED_OUT

TINY = ModelArch(layers=2, hidden=256, heads=4, kv_heads=4, ffn=512, vocab=1000)
LLAMA7 = ModelArch(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000)
MIXTRAL = ModelArch(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, num_experts=8, top_k=2)


def _program(step: str, queue: str = "0.0", out_tok: str = "0.0", post: str | None = None, consts: str = "{}"):
    src = (
        f"CONSTANTS = {consts}\ndef step_time(f, c):\n    return {step}\ndef queueing_time(r, c):\n    return {queue}\n"
        f"def output_token_time(c):\n    return {out_tok}\n"
    )
    if post:
        src += f"def post_decode_time(c):\n    return {post}\n"
    prog = parse_program(src)
    return prog, compile_program(prog), np.array(list(prog.constants.values()), dtype=float)


def _exp(arrival, inputs, outputs, **kw) -> Experiment:
    return Experiment.from_arrays("t", arrival, inputs, outputs, arch=kw.pop("arch", TINY), **kw)


def test_timing_follows_blis_accounting():
    # ready at arrival + 500; one 1000 us step per step; +10 us per output token; +7 after decode
    _, cp, c = _program("1000.0", queue="500.0", out_tok="10.0", post="7.0")
    res = replay(_exp([0], [100], [3]), cp, c)
    assert res.state[0] == FINISHED and res.n_steps == 3
    assert res.ttft_us[0] == 500 + 1000 + 10  # end of the prefill step - arrival + output_token_time
    assert res.e2e_us[0] == 1510 + 2 * (1000 + 10) + 7  # two decode tokens, then post_decode_time


def test_chunked_prefill_spans_steps_under_the_token_budget():
    _, cp, c = _program("1000.0")
    res = replay(_exp([0], [5000], [2], max_num_batched_tokens=2048), cp, c, record=True)
    t = res.trajectory
    assert list(t.new_tokens[t.is_prefill]) == [2048, 2048, 904]
    assert list(t.context[t.is_prefill]) == [0, 2048, 4096]
    assert res.ttft_us[0] == 3000 and res.e2e_us[0] == 4000


def test_prefix_cache_hits_are_not_recomputed():
    _, cp, c = _program("1000.0")
    # request 1 shares request 0's 100-token system prompt: once request 0 has computed it, its 6
    # full blocks are hits; BLIS costs the first chunk with no context, vLLM with the 96 cached tokens
    exp = _exp([0, 5000], [600, 600], [2, 2], prefix_group=[0, 0], prefix_tokens=100)
    for semantics, context in (("blis", 0), ("vllm", 96)):
        t = replay(exp, cp, c, record=True, semantics=semantics).trajectory
        first = np.flatnonzero(t.request == 1)[0]
        assert t.new_tokens[first] == 504 and t.context[first] == context, semantics
    # a group whose prompt is not computed yet gives no hit
    t = replay(_exp([0, 0], [600, 600], [2, 2], prefix_group=[0, 1], prefix_tokens=100), cp, c, record=True).trajectory
    assert list(t.new_tokens[t.step == 0]) == [600, 600]


def test_a_resent_prompt_hits_all_its_full_blocks_and_another_prompt_of_its_group_the_system_prompt():
    _, cp, c = _program("1000.0")
    # prompts 0, 0, 1 of one system-prompt group (100 tokens: 6 full blocks); the resend hits every
    # full block vLLM may use ((600 - 1) // 16 = 37 of them, the last token is always computed), the
    # other prompt only the system prompt's 6
    exp = _exp(
        [0, 5000, 10000], [600, 600, 610], [2, 2, 2], prefix_group=[0, 0, 0], prefix_tokens=100, prompt=[0, 0, 1]
    )
    res = replay(exp, cp, c, record=True, semantics="vllm")
    t = res.trajectory
    firsts = [np.flatnonzero(t.request == r)[0] for r in range(3)]
    assert [int(t.context[i]) for i in firsts] == [0, 592, 96]
    assert [int(t.new_tokens[i]) for i in firsts] == [600, 8, 514]
    assert res.cached_tokens == 592 + 96 and res.admitted_prompt_tokens == 1810
    # BLIS needs not compute a last token: 37 full blocks of 600 hold 592 tokens there too, 8 left
    t = replay(exp, cp, c, record=True, semantics="blis").trajectory
    assert [int(t.new_tokens[np.flatnonzero(t.request == r)[0]]) for r in range(3)] == [600, 8, 514]
    # prompts that differ share nothing but their group's prefix; without groups, nothing at all
    alone = _exp([0, 5000], [600, 600], [2, 2], prompt=[0, 1])
    assert replay(alone, cp, c).cached_tokens == 0


def test_requests_of_one_prompt_need_one_length_and_one_group():
    with pytest.raises(ValueError, match="one input length and one group"):
        _exp([0, 10], [600, 601], [2, 2], prompt=[3, 3])
    with pytest.raises(ValueError, match="one input length and one group"):
        _exp([0, 10], [600, 600], [2, 2], prompt=[3, 3], prefix_group=[0, -1], prefix_tokens=100)


def test_queueing_time_reads_the_step_in_flight_at_the_arrival():
    """r.last_step_us: the duration of the last step started before the request arrived, as BLIS's
    model sees it at the arrival (0 before the first step; the last one, stale, when idle)."""
    _, cp, c = _program("1000.0", queue="r.last_step_us")
    # request 0 keeps the engine busy with 1000 us steps from 0; request 1 arrives at 500, in the
    # first step: ready at 1500, so it misses the step at 1000 and joins the one at 2000
    res = replay(_exp([0, 500], [16, 16], [10, 2]), cp, c)
    assert res.ttft_us[0] == 1000  # arrived before any step: last_step_us = 0
    assert res.ttft_us[1] == 3000 - 500
    _, cp0, c0 = _program("1000.0")
    assert replay(_exp([0, 500], [16, 16], [10, 2]), cp0, c0).ttft_us[1] == 2000 - 500  # no wait: next step
    # an arrival at a step's start sees the step before it (BLIS orders arrivals first in a tick)
    res = replay(_exp([0, 1000], [16, 16], [10, 2]), cp, c)
    assert res.ttft_us[1] == (2000 + 1000) - 1000
    # idle engine: the last step's duration, however long ago
    res = replay(_exp([0, 100_000], [16, 16], [2, 2]), cp, c)
    assert res.ttft_us[1] == 1000 + 1000
    # a step time that depends on the batch: the step in flight, not a constant
    _, cp2, c2 = _program("1000.0 + 500.0 * f.n_req", queue="2 * r.last_step_us")
    res = replay(_exp([0, 0, 1200], [16, 16, 16], [10, 10, 2]), cp2, c2)
    # arrives in the first step (2 requests: 2000 us), ready at 1200 + 4000, joins the step at 6000 (3 requests)
    assert res.ttft_us[2] == (6000 + 2500) - 1200


def test_a_preempted_request_hits_its_own_prompt_blocks_until_they_are_reused():
    _, cp, c = _program("1000.0")
    # 12 blocks: three 32-token prompts (2 blocks each) grow to 5 blocks: the tail is preempted, and
    # on readmission its prompt blocks are still in the cache (nobody took them from the free list)
    exp = _exp([0, 0, 0], [32, 32, 32], [40, 40, 40], kv_blocks=12, block_size=16)
    res = replay(exp, cp, c, record=True, semantics="vllm")
    t = res.trajectory
    assert res.preemptions[2] > 0 and (res.state == FINISHED).all()
    readmit = [i for i in np.flatnonzero((t.request == 2) & t.is_prefill)][1:]
    assert readmit and all(
        t.new_tokens[i] == 16 and t.context[i] == 16 for i in readmit
    )  # block 0 hit, last token recomputed


def test_blis_admits_a_fully_cached_prompt_with_nothing_to_compute():
    _, cp, c = _program("1000.0")
    res = replay(
        _exp([0, 0, 0], [32, 32, 32], [40, 40, 40], kv_blocks=12, block_size=16), cp, c, record=True, semantics="blis"
    )
    t = res.trajectory
    assert res.preemptions[2] > 0 and (res.state == FINISHED).all()
    # the readmitted request's whole prompt is cached: no prefill slot, yet it gets its first token
    assert ((t.request == 2) & t.is_prefill).sum() == 1
    assert ((t.request == 2) & ~t.is_prefill).sum() >= 39


def test_a_deadline_inside_the_last_step_finishes_in_blis_and_times_out_in_vllm():
    _, cp, c = _program("1000.0")
    exp = _exp([0], [10], [3], timeout_s=0.0025)  # the third step ends at 3000 us, after the 2500 us deadline
    assert replay(exp, cp, c, semantics="blis").state[0] == FINISHED
    assert replay(exp, cp, c, semantics="vllm").state[0] == TIMED_OUT


def test_budget_spent_leaves_later_running_requests_waiting_their_turn():
    _, cp, c = _program("1000.0")
    # two long prompts arrive together: the first takes the whole 2048 budget in step 0
    res = replay(_exp([0, 0], [3000, 3000], [2, 2]), cp, c, record=True)
    t = res.trajectory
    step0 = t.step == 0
    assert list(t.request[step0]) == [0] and t.new_tokens[step0][0] == 2048
    step1 = t.step == 1
    assert list(t.request[step1]) == [0, 1] and list(t.new_tokens[step1]) == [952, 1096]


def test_seats_limit_the_running_batch():
    _, cp, c = _program("1000.0")
    res = replay(_exp([0] * 10, [10] * 10, [5] * 10, max_num_seqs=4), cp, c, record=True)
    assert res.trajectory.running.max() == 4
    assert np.bincount(res.trajectory.step).max() == 4
    assert (res.state == FINISHED).all()


def test_preempts_tail_when_kv_full_and_restarts_it():
    _, cp, c = _program("1000.0")
    # 3 requests of 32 prompt + 40 output tokens need 5 blocks each at the end; only 12 blocks exist
    res = replay(
        _exp([0, 0, 0], [32, 32, 32], [40, 40, 40], kv_blocks=12, block_size=16), cp, c, record=True, semantics="vllm"
    )
    assert (res.state == FINISHED).all()
    assert res.preemptions.sum() > 0
    assert res.preemptions[2] > 0 and res.preemptions[0] == 0  # the tail is the victim, the head never
    assert res.trajectory.kv_blocks_used.max() <= 12
    # a preempted request starts over: one prefill per attempt, and all its output tokens again
    t = res.trajectory
    assert ((t.request == 2) & t.is_prefill).sum() == 1 + res.preemptions[2]
    assert ((t.request == 2) & ~t.is_prefill).sum() > 39


def test_admission_stops_at_a_head_that_does_not_fit():
    _, cp, c = _program("1000.0")
    # request 0 holds most blocks; request 1 (long) cannot get its blocks, request 2 (short) must wait behind it
    res = replay(_exp([0, 1, 2], [150, 200, 10], [20, 2, 2], kv_blocks=20, block_size=16), cp, c, record=True)
    t = res.trajectory
    first_step_of = {r: int(t.step[t.request == r].min()) for r in (0, 1, 2)}
    assert first_step_of[1] > 1 and first_step_of[2] >= first_step_of[1]
    assert (res.state == FINISHED).all()


def test_client_timeout_aborts_wherever_the_request_is_and_frees_blocks():
    _, cp, c = _program("100000.0")  # 0.1 s steps
    exp = _exp([0, 0], [100, 100], [50, 2], timeout_s=1.0)
    res = replay(exp, cp, c, record=True)
    assert res.state[0] == TIMED_OUT and res.e2e_us[0] == -1  # needs 50 steps = 5 s > 1 s
    assert res.state[1] == FINISHED
    assert res.trajectory.kv_blocks_used[-1] <= 7


def test_nan_or_non_positive_step_time_is_a_reported_failure():
    _, cp, c = _program("f.n_pf - 1.0")  # 0 for the first prefill step
    res = replay(_exp([0], [10], [3]), cp, c)
    assert (
        not res.ok and "step_time returned 0 (must be finite, positive and at most 1e+15 us) at step 0" == res.failure()
    )
    _, cp, c = _program("1000.0", queue="-(exp(100.0) ** 4) * (exp(100.0) ** 4) * (exp(100.0) ** 4)")
    res = replay(_exp([0], [10], [3]), cp, c)
    assert not res.ok and res.failure().startswith("queueing_time returned -inf")
    _, cp, c = _program(
        "log(f.n_req - f.n_req) * 0.0 + sqrt(-1.0) / 0.0 + (f.n_req ** -1.0) * 0.0 + 0.0 * (0.0 ** -1.0)"
    )
    res = replay(_exp([0], [10], [3]), cp, c)
    assert not res.ok


def _random_workload(seed: int, scarce_kv: bool, crowded: bool = False):
    """crowded: three short prompts resent among fresh ones, more seats than the token budget.
    BLIS admits a fully cached prompt with no token to compute, so the batch can outgrow the
    budget, and a request scheduled in one step can miss the next when the budget runs out."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 120))
    arrival = np.sort(rng.integers(0, 200_000 if crowded else 3_000_000, n))
    prompt = np.where(rng.random(n) < 0.5, rng.integers(0, 3, n), 3 + np.arange(n)) if crowded else None
    inputs = np.where(prompt < 3, 16 * (prompt + 1), rng.integers(1, 60, n)) if crowded else rng.integers(1, 3000, n)
    outputs = rng.integers(100 if crowded else 1, 400, n)
    groups = np.where((rng.random(n) < 0.5) & (inputs > 100), rng.integers(0, 3, n), -1)
    kv = int(rng.integers(200, 400)) if scarce_kv else 100_000
    return _exp(
        arrival,
        inputs,
        outputs,
        prefix_group=groups,
        prefix_tokens=100,
        prompt=prompt,
        kv_blocks=kv,
        block_size=16,
        max_num_seqs=int(rng.integers(64, 128)) if crowded else int(rng.integers(2, 64)),
        max_num_batched_tokens=int(rng.choice([16, 48])) if crowded else int(rng.choice([256, 512, 2048])),
        timeout_s=float(rng.choice([5.0, 300.0])),
        arch=LLAMA7,
    )


@pytest.mark.parametrize("seed", range(48))
def test_invariants_hold_on_random_workloads(seed):
    exp = _random_workload(seed, scarce_kv=seed % 2 == 0, crowded=seed >= 40)
    prog, cp, c = _program(
        "c.base + c.k * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc) + f.weights + f.kv_read",
        queue="c.q",
        out_tok="20.0",
        consts='{"base": 2000.0, "k": 1.5, "q": 300.0}',
    )
    semantics = "blis" if seed % 4 < 2 else "vllm"
    res = replay(exp, cp, c, record=True, semantics=semantics)
    assert res.ok
    t, s = res.trajectory, exp.server
    # every request finishes or times out, exactly once (a state is final and unique)
    assert np.isin(res.state, [FINISHED, TIMED_OUT]).all()
    assert ((res.e2e_us >= 0) == (res.state == FINISHED)).all()
    fin = res.state == FINISHED
    assert (res.ttft_us[fin] > 0).all() and (res.ttft_us[fin] <= res.e2e_us[fin]).all()
    # budget, seats and KV capacity are never exceeded
    per_step_tokens = np.bincount(t.step, weights=t.new_tokens, minlength=t.n_steps)
    assert per_step_tokens.max() <= s.max_num_batched_tokens
    assert np.bincount(t.step, minlength=t.n_steps).max() <= s.max_num_seqs
    assert t.running.max() <= s.max_num_seqs
    assert t.kv_blocks_used.max() <= s.kv_blocks
    # tokens are conserved (vLLM semantics, where every attempt computes at least the prompt's last
    # token): the attempt that finished computed the prompt less whole cached blocks and output-1
    # decode tokens; each restart is one preemption
    for r in np.flatnonzero(fin) if semantics == "vllm" else []:
        slots = np.flatnonzero(t.request == r)
        pf = slots[t.is_prefill[slots]]
        starts = [
            i for k, i in enumerate(pf) if k == 0 or t.context[i] != t.context[pf[k - 1]] + t.new_tokens[pf[k - 1]]
        ]
        # (a request preempted right after a chunk that ended on a block boundary resumes where it was)
        assert 1 <= len(starts) <= 1 + res.preemptions[r]
        last = slots[slots >= starts[-1]]
        computed = t.new_tokens[last][t.is_prefill[last]].sum()
        assert t.context[starts[-1]] % 16 == 0 and t.context[starts[-1]] + computed == exp.input_tokens[r]
        assert (~t.is_prefill[last]).sum() == exp.output_tokens[r] - 1
    # the clock only moves by step durations (and idle gaps to the next ready request)
    assert (np.diff(t.step_start_us) >= t.step_us[:-1]).all()
    # each request's runs of consecutive steps are its rows' steps (what record keeps without rows)
    assert sorted(map(tuple, t.runs)) == _runs_of(t.request, t.step)
    # without rows, steps in which the batch only decodes are taken as stretches: the same
    # schedule, clock, blocks and request times as the step-by-step replay that keeps rows
    assert res.stretch_steps == 0
    lean_res = replay(exp, cp, c, record=True, semantics=semantics, rows=False)
    lean = lean_res.trajectory
    assert lean.step is None and np.array_equal(lean.runs, t.runs) and np.array_equal(lean.totals, t.totals)
    for name in ("step_start_us", "step_us", "kv_blocks_used", "running"):
        assert np.array_equal(getattr(lean, name), getattr(t, name)), name
    plain = replay(exp, cp, c, semantics=semantics)
    for other in (lean_res, plain):
        assert (other.n_steps, other.clock_us) == (res.n_steps, res.clock_us)
        for name in ("ttft_us", "e2e_us", "state", "preemptions"):
            assert np.array_equal(getattr(other, name), getattr(res, name)), name
    assert plain.stretch_steps > 0 or seed < 40  # a crowded batch decodes alone between events


@pytest.mark.parametrize("seed", range(10))
def test_stretches_admit_arrivals_as_the_step_by_step_replay_does(seed):
    """A request that arrives while the batch only decodes is admitted inside the stretch. With
    prompts resent and a scarce cache, the blocks that step's decodes take can evict the cached
    prefix the admitted request would hit, and deadlines, seats and a queue of several cut
    stretches short: the replay without rows (stretches) must still be the step-by-step one."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(150, 400))
    prompt = rng.integers(0, 8, n)
    exp = _exp(
        np.sort(rng.integers(0, 12_000_000, n)),
        rng.integers(40, 1200, 8)[prompt],
        rng.integers(1, 300, n),
        prompt=prompt,
        kv_blocks=int(rng.integers(250, 700)),
        block_size=16,
        max_num_seqs=int(rng.integers(8, 48)),
        max_num_batched_tokens=int(rng.choice([512, 2048])),
        timeout_s=float(rng.choice([4.0, 300.0])),
        arch=LLAMA7,
    )
    _, cp, c = _program(
        "c.base + c.k * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc) + f.weights + f.kv_read",
        queue="c.q + 0.5 * r.last_step_us",
        out_tok="20.0",
        consts='{"base": 2000.0, "k": 1.5, "q": 300.0}',
    )
    for semantics in ("blis", "vllm"):
        steps = replay(exp, cp, c, record=True, semantics=semantics)
        lean = replay(exp, cp, c, record=True, rows=False, semantics=semantics)
        assert steps.stretch_steps == 0 and lean.stretch_steps > 0
        assert (lean.n_steps, lean.clock_us, lean.cached_tokens) == (steps.n_steps, steps.clock_us, steps.cached_tokens)
        for name in ("ttft_us", "e2e_us", "state", "preemptions"):
            assert np.array_equal(getattr(lean, name), getattr(steps, name)), name
        for name in ("runs", "totals", "step_start_us", "step_us", "kv_blocks_used", "running"):
            assert np.array_equal(getattr(lean.trajectory, name), getattr(steps.trajectory, name)), name


def _runs_of(request, step) -> list[tuple[int, int, int]]:
    """(request, first step, last step) of every run of consecutive steps a request was scheduled in."""
    out = []
    for r in np.unique(request):
        steps = np.sort(step[request == r])
        breaks = np.flatnonzero(np.diff(steps) != 1)
        out += [(int(r), int(a), int(b)) for a, b in zip(steps[np.r_[0, breaks + 1]], steps[np.r_[breaks, -1]])]
    return sorted(out)


def test_preemption_happens_when_kv_is_scarce():
    preempted = [
        replay(_random_workload(s, True), *_program("5000.0")[1:], record=False).preemptions.sum()
        for s in range(0, 20, 2)
    ]
    assert sum(p > 0 for p in preempted) >= 5
    plenty = [replay(_random_workload(s, False), *_program("5000.0")[1:]).preemptions.sum() for s in range(1, 20, 2)]
    assert sum(plenty) == 0


@pytest.mark.parametrize("arch,tp", [(LLAMA7, 1), (MIXTRAL, 2)])
@pytest.mark.parametrize("component", COMPONENT_NAMES)
def test_replay_components_equal_vectorized_trajectory_components(arch, tp, component):
    exp = _random_workload(5, scarce_kv=False)
    exp = Experiment.from_arrays(
        "t",
        exp.arrival_us,
        exp.input_tokens,
        exp.output_tokens,
        arch=arch,
        tp=tp,
        prefix_group=exp.prefix_group,
        group_tokens=exp.group_tokens,
        max_num_seqs=32,
    )
    # the step time exposes one component: duration = round(3000 + 0.25 * component)
    prog, cp, c = _program(f"3000.0 + 0.25 * f.{component}")
    res = replay(exp, cp, c, record=True)
    t = res.trajectory
    comps = from_trajectory(
        t.step, t.new_tokens, t.context, t.is_prefill, t.n_steps, coefficients(arch, exp.hardware, tp)
    )
    expected = np.maximum(1, np.round(step_times(prog, comps, c)))
    np.testing.assert_array_equal(t.step_us, expected)


@pytest.mark.parametrize("groups, prefix", [([0], 17), ([0], 100), ([-2], 8), ([0, 1], 8)])
def test_in_memory_experiments_reject_what_the_replay_cannot_schedule(groups, prefix):
    """A grouped prompt shorter than the shared prefix, or groups that do not match the requests."""
    with pytest.raises(ValueError, match="prefix_group"):
        Experiment.from_arrays("t", [0], [16], [4], arch=TINY, prefix_group=groups, prefix_tokens=prefix)
    with pytest.raises(ValueError, match="output_tokens >= 1"):
        Experiment.from_arrays("t", [0], [16], [0], arch=TINY)


def test_huge_step_times_are_an_overflow_not_wrapped_around():
    """1e30 us does not fit an int64: it fails the replay as an overflow (over MAX_US, 1e15 us),
    as NaN does, and never counts as 1 us; 1e15 us itself is still a step."""
    exp = _exp([0, 10], [32, 32], [2, 2], timeout_s=1e12)
    results = {}
    for value in ("1e30", "1e15"):
        prog = parse_program(f"def step_time(f, c):\n    return {value}\n")
        results[value] = replay(exp, compile_program(prog), np.zeros(0))
    assert results["1e30"].status == BAD_STEP_TIME and "at most 1e+15 us" in results["1e30"].failure()
    assert results["1e15"].status == OK and (results["1e15"].e2e_us >= 1e15).all()
