"""The trajectory surrogate (exact where recorded, a local model elsewhere) and the trust-region fit built on it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import needs_real_data

from stepml_evolve.evaluator.dsl import compile_program, load_program, parse_program
from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evaluator.scoring.surrogate import SurrogateSet, VectorProgram, record, retime
from stepml_evolve.seeds import baseline_path, seed_path, seed_paths

QUEUE_BY_REQUEST = """
CONSTANTS = {"a": 1.2, "b": 0.8, "base": 300.0, "q": 0.5, "tok": 20.0, "post": 100.0}


def step_time(f, c):
    return max(c.a * (f.gemm_pf + f.attn_pf), c.b * f.weights) + f.kv_read + c.base


def queueing_time(r, c):
    return c.q * r.input_tokens


def output_token_time(c):
    return c.tok


def post_decode_time(c):
    return c.post
"""


def _programs():
    return [(p.stem, load_program(p)) for p in seed_paths()] + [("queue_by_request", parse_program(QUEUE_BY_REQUEST))]


def _vector(program):
    return np.array(list(program.constants.values()), dtype=float)


@pytest.mark.parametrize("name,program", _programs(), ids=lambda x: x if isinstance(x, str) else "")
def test_surrogate_equals_the_closed_loop_where_it_was_recorded(synthetic, name, program):
    compiled, vector = compile_program(program), VectorProgram.of(program)
    c0 = _vector(program)
    for exp in synthetic.experiments:
        for split in ("train", "test"):
            row, model = record(exp, compiled, vector, c0, split)
            e2e, ttft = retime(model, vector, c0[None, :])
            # NaN for both where the split measures no request (the overloaded run's test window)
            assert e2e[0] == pytest.approx(row.ape.e2e, abs=1e-6, nan_ok=True), (exp.name, split)
            assert ttft[0] == pytest.approx(row.ape.ttft, abs=1e-6, nan_ok=True), (exp.name, split)


@needs_real_data
def test_surrogate_equals_the_closed_loop_on_real_experiments(real_experiments):
    program = load_program(seed_path("trained_physics"))
    compiled, vector = compile_program(program), VectorProgram.of(program)
    c0 = _vector(program)
    for exp in real_experiments[:16:5]:  # prefix caching, overload with time-outs, MoE
        row, model = record(exp, compiled, vector, c0)
        e2e, ttft = retime(model, vector, c0[None, :])
        assert (e2e[0], ttft[0]) == pytest.approx((row.ape.e2e, row.ape.ttft), abs=1e-6), exp.name


def test_surrogate_moves_the_means_the_way_the_closed_loop_does(synthetic):
    """Slower steps (every time constant x1.1): the closed loop's mean E2E and TTFT grow, and the
    surrogate's predicted means grow too, by a comparable amount."""
    program = load_program(seed_path("roofline"))
    compiled, vector = compile_program(program), VectorProgram.of(program)
    c0 = _vector(program)
    slower = c0 * 1.1
    for exp in synthetic.experiments:
        row0, model = record(exp, compiled, vector, c0)
        row1, _ = record(exp, compiled, vector, slower)
        obs = np.array([row0.observed.e2e_mean_s, row0.observed.ttft_mean_s])
        closed = np.array(
            [
                row1.predicted.e2e_mean_s - row0.predicted.e2e_mean_s,
                row1.predicted.ttft_mean_s - row0.predicted.ttft_mean_s,
            ]
        )
        e2e, ttft = retime(model, vector, slower[None, :])
        signed = np.array([np.sign(row0.predicted.e2e_mean_s - obs[0]), np.sign(row0.predicted.ttft_mean_s - obs[1])])
        # back from APE to the predicted mean, on the side of the observation the prediction is on
        surrogate = (
            obs
            + signed * np.array([e2e[0], ttft[0]]) / 100 * obs
            - np.array([row0.predicted.e2e_mean_s, row0.predicted.ttft_mean_s])
        )
        assert closed[0] > 0 and surrogate[0] > 0, exp.name
        assert 0.3 < surrogate[0] / closed[0] < 3.0, exp.name


def test_surrogate_set_scores_every_experiment_as_its_own_model_does(synthetic):
    program = parse_program(QUEUE_BY_REQUEST)
    compiled, vector = compile_program(program), VectorProgram.of(program)
    c0 = _vector(program)
    models = [record(e, compiled, vector, c0)[1] for e in synthetic.experiments]
    pop = c0 * np.exp(np.random.default_rng(3).normal(0, 0.2, (7, len(c0))))
    pop[3, 2] = -1e7  # a negative base time: negative step times, a replay that would fail
    e2e, ttft = SurrogateSet(models, vector).apes(pop)
    for i, m in enumerate(models):
        a, b = retime(m, vector, pop)
        np.testing.assert_allclose(e2e[:, i], a, rtol=1e-9)
        np.testing.assert_allclose(ttft[:, i], b, rtol=1e-9)
    assert np.all(np.isinf(e2e[3])) and np.all(np.isfinite(np.delete(e2e, 3, axis=0)))


def test_decoded_tokens_per_step_from_runs_are_those_of_the_rows(synthetic):
    """record counts the tokens decoded per step for finished requests after their first token
    from each request's runs of steps: the numbers the trajectory's rows give."""
    from stepml_evolve.evaluator.replay.closed_loop import replay
    from stepml_evolve.evaluator.replay.state import FINISHED
    from stepml_evolve.evaluator.scoring.surrogate import _decode_steps

    program = load_program(seed_path("roofline"))
    compiled, c0 = compile_program(program), _vector(program)
    for exp in synthetic.experiments:
        res = replay(exp, compiled, c0, record=True)
        t, finished = res.trajectory, res.state == FINISHED
        first = np.random.default_rng(0).integers(-1, t.n_steps, exp.n_requests)
        rows = finished[t.request] & (t.step > first[t.request])
        got, total = _decode_steps(t.runs, finished, first, t.n_steps)
        np.testing.assert_array_equal(got, np.bincount(t.step[rows], minlength=t.n_steps))
        assert total == rows.sum()


NONLINEAR_QUEUE = QUEUE_BY_REQUEST.replace(
    "return c.q * r.input_tokens", "return max(c.q * sqrt(r.input_tokens), c.base * 0.001 * r.last_step_us)"
)


@pytest.mark.parametrize("name", ["blackbox", "roofline", "regime_switch", "nonlinear_queue"])
def test_classes_bin_only_what_the_program_is_not_affine_in(synthetic, name):
    """Steps (and queued requests) that differ only in inputs the program is affine in are one
    class: the means are those of binning every input, with far fewer classes (a program affine
    in every component has one step class per weight row)."""
    import dataclasses

    from stepml_evolve.evaluator.scoring.surrogate import REQUEST_ROWS

    program = (
        parse_program(NONLINEAR_QUEUE)
        if name == "nonlinear_queue"
        else load_program(baseline_path(name) if name == "blackbox" else seed_path(name))
    )
    compiled, vector = compile_program(program), VectorProgram.of(program)
    every = dataclasses.replace(vector, class_keys=None, request_keys=tuple(range(len(REQUEST_ROWS))))
    c0 = _vector(program)
    pop = c0 * np.exp(np.random.default_rng(5).normal(0, 0.2, (6, len(c0))))
    keyed = SurrogateSet([record(e, compiled, vector, c0)[1] for e in synthetic.experiments], vector)
    binned = SurrogateSet([record(e, compiled, every, c0)[1] for e in synthetic.experiments], every)
    np.testing.assert_allclose(keyed.means(pop)[0], binned.means(pop)[0], rtol=1e-3)
    assert keyed.n_classes < binned.n_classes
    if name == "blackbox":
        # per weight row one step class, and two request classes: a step ran before the arrival, or none
        assert all(m.weight.shape[1] <= 2 and m.request_weight.shape[1] <= 4 for m in keyed.models)
    if (
        name == "nonlinear_queue"
    ):  # max() over r.last_step_us: the arrivals' steps are binned on every component it reads
        assert {"r_input_tokens", "arrival_step", "f_gemm_pf", "f_weights", "f_kv_read"} <= {
            REQUEST_ROWS[i] for i in vector.request_keys
        }


def test_trust_region_comes_near_the_cmaes_loss_with_a_tenth_of_the_replays(synthetic_full):
    """Within 10% of the loss plain CMA-ES reaches with its default budget, on the full sample (on
    a draft of the small one it ended 45% above, 2.27 against 1.57; docs/HISTORY.md has the figures
    on the real data: the trust region does not always match it). On the seed without its bounds:
    inside them CMA-ES finds a luckier point here (2.54 against 2.90; test_bounds.py checks fits
    with bounds)."""
    import dataclasses

    program = dataclasses.replace(load_program(seed_path("roofline")), bounds={})
    exps = synthetic_full.experiments
    with ReplayPool(exps) as pool:
        tr = fit_constants(program, exps, pool, FitConfig(seed=3))
        cma = fit_constants(program, exps, pool, FitConfig(seed=3, method="cmaes"))
    assert tr.loss <= cma.loss * 1.10, (tr.loss, cma.loss)
    assert tr.evaluations * 10 <= cma.evaluations, (tr.evaluations, cma.evaluations)
    start = fit_constants(program, exps, ReplayPool(exps, 1), FitConfig(seed=3, max_evals=1))
    assert tr.loss < start.loss  # it moved


def test_trust_region_fit_is_the_same_whatever_the_worker_count(synthetic):
    program = parse_program(QUEUE_BY_REQUEST)
    cfg = FitConfig(seed=5, max_evals=8)
    results = []
    for workers in (1, 2):
        with ReplayPool(synthetic.experiments, workers) as pool:
            results.append(fit_constants(program, synthetic.experiments, pool, cfg))
    assert results[0].constants == results[1].constants and results[0].history == results[1].history


def test_a_start_that_cannot_be_replayed_falls_back_to_cmaes(synthetic):
    """No trajectory can be recorded where step_time is negative: the fit goes on with CMA-ES
    (which, on a landscape where every replay fails, stops after one generation). Physics off: under
    --physics check a constant with no min is held at 0 or above, which moves the start back."""
    program = parse_program(QUEUE_BY_REQUEST)  # unbounded: a seed's bounds would move the start back into range
    bad = {**program.constants, "base": -1e5}
    with ReplayPool(synthetic.experiments) as pool:
        res = fit_constants(
            program, synthetic.experiments, pool, FitConfig(seed=1, max_evals=60, floor=False), start=bad
        )
    assert res.history[0][1] >= 1e5 and res.evaluations > 1 and res.iterations >= 1


def test_a_model_with_no_weighted_step_keeps_its_recorded_errors_in_a_set(synthetic):
    """A split whose measured requests all timed out has no step that moves its means: its
    errors stay as recorded, and the models around it are scored as on their own."""
    import dataclasses

    program = load_program(seed_path("roofline"))
    compiled, vector = compile_program(program), VectorProgram.of(program)
    c0 = _vector(program)
    first, second = (record(e, compiled, vector, c0)[1] for e in synthetic.experiments[:2])
    frozen = dataclasses.replace(
        first,
        name="frozen",
        weight=np.zeros((2, 0)),
        components={k: np.zeros(0) for k in first.components},
        queued_count=np.zeros(2),
        requests={k: np.zeros(0) for k in first.requests},
        request_weight=np.zeros((2, 0)),
        out_tok_count=np.zeros(2),
        n_finished=0,
        linear0=np.zeros(2),
    )
    pop = c0 * np.array([[1.0], [1.3], [0.8]])
    e2e, ttft = SurrogateSet([first, frozen, second], vector).apes(pop)
    recorded = np.abs(first.recorded_us - first.observed_us) / first.observed_us * 100
    np.testing.assert_allclose(e2e[:, 1], recorded[0]) and np.testing.assert_allclose(ttft[:, 1], recorded[1])
    for i, m in ((0, first), (2, second)):
        a, b = retime(m, vector, pop)
        np.testing.assert_allclose(e2e[:, i], a, rtol=1e-9)
        np.testing.assert_allclose(ttft[:, i], b, rtol=1e-9)


def test_a_replay_in_which_no_step_ran_records_an_empty_model_not_a_traceback():
    """A child whose queueing delay outlasts every request's client limit schedules no step (seen
    at generation 38 of a real-data run): record returns its row and an empty model."""
    from stepml_evolve.evaluator.data.experiments import Experiment
    from stepml_evolve.evaluator.hardware.catalog import catalog

    program = parse_program(
        '"""q"""\nCONSTANTS = {"q": 1.0e12}\n\ndef step_time(f, c):\n    return 1000 + f.weights\n\n'
        "def queueing_time(r, c):\n    return c.q\n\ndef output_token_time(c):\n    return 10\n"
    )
    arch = catalog().models["meta-llama/Llama-3.1-8B"].arch
    exp = Experiment.from_arrays(
        "stalled", np.arange(20) * 100_000, np.full(20, 300), np.full(20, 20), arch=arch, timeout_s=5.0
    )
    row, model = record(exp, compile_program(program), VectorProgram.of(program), np.array([1.0e12]), "all")
    assert model is not None and model.weight.shape == (2, 0)
    assert row.n_requests >= 0


def test_a_pending_model_is_the_recorded_model_built_on_demand_with_the_gain_it_was_given(synthetic):
    # the trust region builds a judged point's model only if it accepts the point; until then the
    # point offers its closed-loop means and takes the gain learned from it
    program = parse_program(QUEUE_BY_REQUEST)
    compiled, vector, c0 = compile_program(program), VectorProgram.of(program), _vector(program)
    exp = synthetic.experiments[0]
    row, eager = record(exp, compiled, vector, c0)
    row_p, pending = record(exp, compiled, vector, c0, pending=True)
    assert row_p == row and pending.n_ok == eager.n_ok
    assert np.array_equal(pending.recorded_us, eager.recorded_us)
    pending.gain = np.array([1.5, 2.0])
    built = pending.model()
    assert built is pending.model() and np.array_equal(built.gain, [1.5, 2.0])
    for name in ("weight", "queued_count", "out_tok_count", "linear0", "request_weight"):
        assert np.array_equal(getattr(built, name), getattr(eager, name)), name
    assert all(np.array_equal(built.components[k], eager.components[k]) for k in eager.components)


@pytest.mark.parametrize("keys", [None, (0, 2)])
def test_classes_are_the_plain_numpy_grouping_to_the_last_bit(keys):
    """Classes labelled by pandas' hash table and summed for every weight row in one pass are the
    grouping np.unique(return_inverse=True) and np.bincount give, bit for bit: the same classes in
    the same order, the same sums (the search's archive does not move with the implementation)."""
    from stepml_evolve.evaluator.scoring.surrogate import CLASS_WIDTH, _class_hash, _classes

    rng = np.random.default_rng(3)
    # few distinct rows, repeated and scaled inside one class width, with zeros and negatives
    base = rng.choice([0.0, -2.0, 1.0, 7.5, 1e4, 3e6], size=(4, 40))
    comps = np.repeat(base, 50, axis=1) * rng.uniform(1.0, 1.01, (4, 2000))
    weight = np.stack([rng.random(2000) * (rng.random(2000) < 0.7), rng.random(2000) < 0.5])
    reps, w = _classes(comps, weight, keys)

    keyed = comps if keys is None else comps[list(keys)]
    mix = np.random.default_rng(0).integers(1, 2**62, size=len(keyed), dtype=np.int64) | 1
    _, cls = np.unique(_class_hash(keyed, mix, np.log(CLASS_WIDTH)), return_inverse=True)
    cols, weights = [], []
    for i, row in enumerate(weight.astype(np.float64)):
        total = np.bincount(cls, weights=row)
        keep = total > 0
        sums = np.stack([np.bincount(cls, weights=row * c, minlength=len(total)) for c in comps])
        cols.append(sums[:, keep] / total[keep])
        weights.append(np.zeros((len(weight), keep.sum())))
        weights[-1][i] = total[keep]
    np.testing.assert_array_equal(reps, np.concatenate(cols, axis=1))
    np.testing.assert_array_equal(w, np.concatenate(weights, axis=1))
    assert 1 < w.shape[1] < 2 * comps.shape[1]
