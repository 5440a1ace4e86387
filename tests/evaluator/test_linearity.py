"""Which constants a program is affine in (dsl/linearity.py), one case per operator of the table,
and the least-squares step built on it (linear_solve.py): on a real recorded surrogate its
solution is the surrogate's optimum, and a constant that enters non-linearly is never solved.
The same analysis over the data (components, request fields) decides which inputs the
surrogate's step and request classes must bin: one case per operator there too."""

from __future__ import annotations

import numpy as np
import pytest

from stepml_evolve.evaluator.dsl import compile_program, load_program, parse_program
from stepml_evolve.evaluator.dsl.linearity import linear_constants, nonaffine_inputs
from stepml_evolve.evaluator.dsl.operators import OPERATORS
from stepml_evolve.evaluator.dsl.program import Prior
from stepml_evolve.evaluator.fit.fitting import _quiet_cma
from stepml_evolve.evaluator.fit.linear_solve import LinearSolve, solvable
from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES
from stepml_evolve.evaluator.scoring.objectives import Objective
from stepml_evolve.evaluator.scoring.surrogate import SurrogateSet, VectorProgram, record
from stepml_evolve.seeds import baseline_path, seed_path

# (operator symbol, exponent kind) -> step_time bodies and the constants they are affine in
# (of a, b, s); every row of the operator table needs one, so a new operator needs a case here
CASES = {
    ("+", None): [("c.a * f.gemm_pf + c.b", "ab")],
    ("-", None): [("c.a * f.gemm_pf - c.b", "ab"), ("-(c.a * f.gemm_pf) + c.b * f.n_req", "ab")],
    ("*", None): [("c.a * f.gemm_pf * 2.0 + c.b", "ab"), ("c.a * c.b * f.gemm_pf", "a")],
    ("/", None): [("c.a * f.gemm_pf / f.n_req + c.b", "ab"), ("f.gemm_pf / c.a + c.b", "b")],
    ("+u", None): [("+(c.a * f.gemm_pf) + c.b", "ab")],
    ("max", None): [("max(c.a * f.gemm_pf, c.b * f.weights) + c.s", "s")],
    ("min", None): [("min(c.a * f.gemm_pf, 1.0) + c.b", "b")],
    ("abs", None): [("abs(c.a * f.gemm_pf) + c.b", "b")],
    ("sqrt", None): [("sqrt(c.a * f.gemm_pf) + c.b", "b")],
    ("log", None): [("log(c.a) * f.gemm_pf + c.b", "b")],
    ("exp", None): [("exp(c.a) * f.gemm_pf + c.b", "b")],
    ("**", "integer"): [
        ("(c.a * f.gemm_pf) ** 2 + c.b", "b"),
        ("(c.a * f.gemm_pf) ** 1 + c.b", "ab"),
        ("(c.a * f.gemm_pf) ** 0 + c.b", "ab"),
    ],
    ("**", "other"): [("(c.a * f.gemm_pf) ** 1.5 + c.b", "b")],
    ("<", None): [("c.a * f.gemm_pf if f.tok_pf < c.s else c.b", "ab")],
    ("<=", None): [("c.a * f.gemm_pf if c.s * f.n_req <= f.tok_pf else c.b", "ab")],
    (">", None): [("c.a * f.gemm_pf if f.tok_pf > c.s else c.b", "ab")],
    (">=", None): [("c.a * f.gemm_pf if f.tok_pf >= c.s else c.b", "ab")],
    ("==", None): [("c.a * f.gemm_pf if f.tok_pf == c.s else c.b", "ab")],
    ("!=", None): [("c.a * f.gemm_pf if f.tok_pf != c.s else c.b", "ab")],
    ("and", None): [("c.a * f.gemm_pf if f.tok_pf > 1.0 and f.n_req < c.s else c.b", "ab")],
    ("or", None): [("c.a * f.gemm_pf if f.tok_pf > 1.0 or f.n_req < c.s else c.b", "ab")],
    ("not", None): [("c.a * f.gemm_pf if not f.tok_pf > c.s else c.b", "ab")],
    ("if-else", None): [("(c.a * f.gemm_pf if f.tok_pf > 64.0 else c.b * f.weights) + c.s", "abs")],
}


# the same for the components: step_time bodies and the components it is not affine in (for
# fixed constants), which the surrogate's step classes bin; the others are averaged exactly
COMPONENT_CASES = {
    ("+", None): [("f.gemm_pf + c.b * f.n_req", "")],
    ("-", None): [("c.a * f.gemm_pf - f.n_req", ""), ("-(f.gemm_pf) + c.b", "")],
    ("*", None): [("c.a * f.gemm_pf * 2.0 + c.b", ""), ("f.gemm_pf * f.n_req + f.weights", "n_req")],
    ("/", None): [("f.gemm_pf / c.a + c.b", ""), ("f.gemm_pf / f.n_req", "n_req")],
    ("+u", None): [("+(c.a * f.gemm_pf) + f.weights", "")],
    ("max", None): [("max(c.a * f.gemm_pf, c.b * f.weights) + f.n_req", "gemm_pf weights")],
    ("min", None): [("min(f.gemm_pf, 1.0) + f.n_req", "gemm_pf")],
    ("abs", None): [("abs(f.gemm_pf) + f.n_req", "gemm_pf")],
    ("sqrt", None): [("sqrt(f.gemm_pf) + f.n_req", "gemm_pf")],
    ("log", None): [("log(f.gemm_pf) + f.n_req", "gemm_pf"), ("log(c.a) * f.gemm_pf", "")],
    ("exp", None): [("exp(f.n_req) * f.gemm_pf", "n_req")],
    ("**", "integer"): [("f.gemm_pf ** 2 + f.n_req", "gemm_pf"), ("f.gemm_pf ** 1 + f.n_req", "")],
    ("**", "other"): [("f.gemm_pf ** 1.5 + f.n_req", "gemm_pf")],
    ("<", None): [("c.a * f.gemm_pf if f.tok_pf < c.s else c.b", "tok_pf")],
    ("<=", None): [("c.a * f.gemm_pf if c.s * f.n_req <= 64.0 else c.b", "n_req")],
    (">", None): [("c.a * f.gemm_pf if f.tok_pf > c.s else c.b", "tok_pf")],
    (">=", None): [("c.a * f.gemm_pf if f.tok_pf >= c.s else c.b", "tok_pf")],
    ("==", None): [("c.a * f.gemm_pf if f.tok_pf == c.s else c.b", "tok_pf")],
    ("!=", None): [("c.a * f.gemm_pf if f.tok_pf != c.s else c.b", "tok_pf")],
    ("and", None): [("f.gemm_pf if f.tok_pf > 1.0 and f.n_req < c.s else c.b", "n_req tok_pf")],
    ("or", None): [("f.gemm_pf if f.tok_pf > 1.0 or f.n_req < c.s else c.b", "n_req tok_pf")],
    ("not", None): [("f.gemm_pf if not f.tok_pf > c.s else c.b", "tok_pf")],
    ("if-else", None): [("(f.gemm_pf if f.tok_pf > 64.0 else f.weights) + f.n_req", "tok_pf")],
}


def _program(body: str, queue: str | None = None):
    src = 'CONSTANTS = {"a": 1.5, "b": 20.0, "s": 64.0, "q": 100.0, "lag": 1.0}\n\n\ndef step_time(f, c):\n'
    src += f"    return {body}\n"
    if queue:
        src += f"\n\ndef queueing_time(r, c):\n    return {queue}\n"
    return parse_program(src)


def test_every_operator_has_a_case():
    rows = {("+u" if op.identity else op.symbol, op.exponent) for op in OPERATORS}
    assert rows <= set(CASES), f"operators without a linearity case: {sorted(rows - set(CASES), key=str)}"


@pytest.mark.parametrize("key", list(CASES), ids=lambda k: f"{k[0]}{'' if k[1] is None else '-' + k[1]}")
def test_the_constants_an_operator_keeps_affine(key):
    for body, expected in CASES[key]:
        got = {k for k in linear_constants(_program(body)) if k in "abs"}
        assert got == set(expected), body


@pytest.mark.parametrize("key", list(COMPONENT_CASES), ids=lambda k: f"{k[0]}{'' if k[1] is None else '-' + k[1]}")
def test_the_components_an_operator_keeps_affine(key):
    assert {("+u" if op.identity else op.symbol, op.exponent) for op in OPERATORS} <= set(COMPONENT_CASES)
    for body, expected in COMPONENT_CASES[key]:
        assert set(nonaffine_inputs(_program(body), "step_time", "f", COMPONENT_NAMES)) == set(expected.split()), body


def test_the_request_fields_queueing_time_keeps_affine():
    fields = ["input_tokens", "output_tokens", "last_step_us"]
    for queue, expected in [
        ("c.q + c.lag * r.last_step_us", ""),
        ("c.q * r.input_tokens + r.output_tokens", ""),
        ("max(c.q, c.lag * r.last_step_us)", "last_step_us"),
        ("c.q * sqrt(r.input_tokens) + r.last_step_us", "input_tokens"),
        ("c.q if r.output_tokens > 100.0 else c.lag * r.input_tokens", "output_tokens"),
    ]:
        got = nonaffine_inputs(_program("f.gemm_pf", queue=queue), "queueing_time", "r", fields)
        assert set(got) == set(expected.split()), queue


def test_a_constant_multiplying_the_step_in_flight_leaves_the_smaller_side():
    """r.last_step_us carries step_time's affine constants: a product with it keeps the larger side
    (on a tie, the left operand)."""
    program = _program("c.a * f.gemm_pf + c.b", queue="c.q + c.lag * r.last_step_us")
    assert set(linear_constants(program)) & {"a", "b", "q", "lag"} == {"a", "b", "q"}
    program = _program("c.a * f.gemm_pf", queue="c.q + c.lag * r.last_step_us")
    assert set(linear_constants(program)) & {"a", "q", "lag"} == {"q", "lag"}


def test_a_local_used_twice_in_a_product_is_not_affine():
    src = (
        'CONSTANTS = {"a": 1.5, "b": 2.0}\n\n\ndef step_time(f, c):\n    x = c.a * f.gemm_pf\n    return x * x + c.b\n'
    )
    assert linear_constants(parse_program(src)) == ("b",)


def test_the_seeds_linear_constants():
    assert linear_constants(load_program(baseline_path("blackbox"))) == tuple(
        load_program(baseline_path("blackbox")).constants
    )
    tp = load_program(seed_path("trained_physics"))  # its FLOP and byte terms meet in a roofline (max)
    inside_max = {"beta_pf_gemm", "beta_pf_attn", "beta_dc_gemm", "beta_dc_attn", "beta_weights", "beta_kv"}
    assert set(tp.constants) - set(linear_constants(tp)) == inside_max | {"lag_steps"}
    roofline = load_program(seed_path("roofline"))
    assert {"c_compute", "c_memory"}.isdisjoint(linear_constants(roofline))  # inside max()


def _surrogate(program, experiments):
    compiled, vector = compile_program(program), VectorProgram.of(program)
    c0 = np.array(list(program.constants.values()), dtype=float)
    models = [record(e, compiled, vector, c0, "train")[1] for e in experiments]
    return SurrogateSet(models, vector), c0


def _loss(surrogate, objective, population):
    e2e, ttft = surrogate.apes(population)
    return objective.of_apes([m.name for m in surrogate.models], e2e, ttft)


def test_the_solve_finds_the_surrogates_optimum_in_the_box(synthetic):
    """blackbox is affine in all six constants: one solve against CMA-ES with a large budget on the
    same surrogate and box; the solve is at least as good, and moves no constant out of the box."""
    program = load_program(baseline_path("blackbox"))
    surrogate, c0 = _surrogate(program, synthetic.experiments)
    objective = Objective()
    lo, hi = c0 * np.exp(-1.0), c0 * np.exp(1.0)
    solved = LinearSolve(surrogate, objective, np.arange(len(c0))).solve(c0[None, :], lo, hi)[0]
    assert np.all(solved >= lo - 1e-9) and np.all(solved <= hi + 1e-9)
    start, best = _loss(surrogate, objective, np.array([c0, solved]))
    assert best < start
    es = _quiet_cma(
        np.log(c0), 0.3, {"seed": 1, "bounds": [list(np.log(lo)), list(np.log(hi))], "maxfevals": 3000, "verbose": -9}
    )
    sampled = start
    while not es.stop():
        X = es.ask()
        values = _loss(surrogate, objective, np.exp(np.array(X)))
        es.tell(X, values)
        sampled = min(sampled, float(values.min()))
    assert best <= sampled + 1e-3 * sampled


def test_only_the_affine_constants_move_and_worst3_is_not_solved(synthetic):
    program = load_program(seed_path("roofline"))
    surrogate, c0 = _surrogate(program, synthetic.experiments)
    index = [list(program.constants).index(k) for k in linear_constants(program)]
    lo, hi = c0 * 0.5, c0 * 2.0
    solved = LinearSolve(surrogate, Objective(), index).solve(c0[None, :], lo, hi)[0]
    fixed = [i for i in range(len(c0)) if i not in index]
    assert np.array_equal(solved[fixed], c0[fixed])
    assert solvable(Objective("rms")) and not solvable(Objective("worst3"))


def test_priors_are_part_of_what_the_solve_minimizes(synthetic):
    """Tight priors (relative on one constant, absolute on another) halfway between the start and
    where the free solve takes them, on the two constants it moves most: the solve takes them to
    their priors' centres, not to the start nor to the free optimum, and its loss plus the priors'
    penalty is below both."""
    program = load_program(baseline_path("blackbox"))
    surrogate, c0 = _surrogate(program, synthetic.experiments)
    objective = Objective()
    lo, hi = c0 * np.exp(-1.0), c0 * np.exp(1.0)
    index = np.arange(len(c0))
    free = LinearSolve(surrogate, objective, index).solve(c0[None, :], lo, hi)[0]
    moved = np.argsort(-np.abs(np.log(free / c0)))[:2]
    assert np.all(np.abs(np.log(free[moved] / c0[moved])) > 0.05)  # the data pull them away
    centre = np.sqrt(free * c0)
    priors: list = [None] * len(c0)
    priors[moved[0]] = Prior(centre[moved[0]], 0.005, relative=True)
    priors[moved[1]] = Prior(centre[moved[1]], 0.005 * centre[moved[1]], relative=False)
    held = LinearSolve(surrogate, objective, index, priors).solve(c0[None, :], lo, hi)[0]
    assert np.all(np.abs(held[moved] / centre[moved] - 1) < 0.01)

    def penalized(v):
        return _loss(surrogate, objective, v[None, :])[0] + sum(p.penalty(v[j]) for j, p in enumerate(priors) if p)

    assert penalized(held) < min(penalized(free), penalized(c0))


def _twin_program(prior: str = ""):
    """a and b are both a step's base cost: no surrogate can tell them apart (without a prior)."""
    return parse_program(
        'CONSTANTS = {"a": {"start": 3000.0, "min": 0.0' + prior + '}, "b": 3000.0, "s": 15.0}\n\n\n'
        "def step_time(f, c):\n    return c.a + c.b + c.s * f.tok_pf + 30.0 * f.n_dc\n"
    )


def test_a_singular_solve_keeps_its_values_and_says_why(synthetic):
    """Two affine constants that move the means alike have no one best value: the vector keeps its
    values and the solver says which constants; a prior on one of them tells them apart."""
    program = _twin_program()
    assert set(linear_constants(program)) == {"a", "b", "s"}
    surrogate, c0 = _surrogate(program, synthetic.experiments)
    lo, hi = c0 * 0.5, c0 * 2.0
    solver = LinearSolve(surrogate, Objective(), np.arange(3), names=["a", "b", "s"])
    assert np.array_equal(solver.solve(c0[None, :], lo, hi)[0], c0)
    assert solver.reason and solver.reason.startswith("singular: a, b, s move the means along 2 direction(s)")
    priored = _twin_program(', "prior": 3000.0, "spread": 100.0')
    surrogate, c0 = _surrogate(priored, synthetic.experiments)
    priors = [priored.priors.get(k) for k in "abs"]
    solver = LinearSolve(surrogate, Objective(), np.arange(3), priors, ["a", "b", "s"])
    solved = solver.solve(c0[None, :], lo, hi)[0]
    assert solver.reason is None and not np.array_equal(solved, c0)


def test_a_fit_whose_solve_is_singular_samples_and_records_why(synthetic):
    """`--linear solve` on a program whose solve is singular: every such step samples all the
    constants (as `--linear sample` does), the fit's result counts why, and the fit still gains."""
    from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants
    from stepml_evolve.evaluator.scoring.pool import ReplayPool

    program = _twin_program()
    with ReplayPool(synthetic.experiments, 1) as pool:
        solved = fit_constants(program, synthetic.experiments, pool, FitConfig(seed=3, max_evals=6, linear_solve=True))
        sampled = fit_constants(program, synthetic.experiments, pool, FitConfig(seed=3, max_evals=6))
    (note,) = solved.notes
    assert note.startswith("linear solve: singular: a, b, s") and note.endswith("sampled instead")
    assert solved.notes[note] >= 1 and sampled.notes == {}
    assert solved.loss < solved.history[0][1]
    assert solved.loss == sampled.loss  # every step sampled: the same fit as without the solve
