"""Bounded constants: `"name": {"start": s, "min": lo, "max": hi}` in CONSTANTS. Parsed and
rejected with the line, written back by with_constants, honoured by both fit methods through
pycma's bound handling, kept by the symbolic operators, invisible to the Go emitter."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from conftest import only_error_line
from typer.testing import CliRunner

from stepml_evolve.evaluator.dsl import ProgramError, load_program, parse_program
from stepml_evolve.evaluator.dsl.program import render_constants
from stepml_evolve.evaluator.fit.fitting import Coordinates, FitConfig, fit_constants
from stepml_evolve.evaluator.known_truth.synthetic_sample import ORACLE_SOURCE
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.go.source import go_source
from stepml_evolve.evolve.search.symbolic import OPERATORS, NotRepresentable, mutate
from stepml_evolve.seeds import seed_path, seed_paths

BOUNDED = '''"""Bounded."""
CONSTANTS = {
    "a": {"start": 1.5, "min": 1.0, "max": 50.0},
    "b": 3.0,
    "q": {"start": 2.0, "min": 0},
    "n": {"start": -2.0, "max": -1},
    "u": {"start": 7.0},
}


def step_time(f, c):
    return c.a * f.gemm_pf + c.b + c.q + c.n + c.u
'''


def _with_constant(text: str) -> str:
    """A program whose one constant `a` is written as `text` (on line 2)."""
    return f'CONSTANTS = {{\n    "a": {text},\n}}\n\n\ndef step_time(f, c):\n    return c.a + f.weights\n'


def _plain(program) -> str:
    """The program's text with its CONSTANTS block in the plain form (starting values, no bounds)."""
    lines = program.source.splitlines()
    a, b = program.constants_span
    return "\n".join(lines[: a - 1] + render_constants(program.constants).splitlines() + lines[b:]) + "\n"


# ---- parsing and writing back ----


def test_the_dict_form_gives_starting_values_and_bounds_of_the_bounded_constants_only():
    p = parse_program(BOUNDED)
    assert p.constants == {"a": 1.5, "b": 3.0, "q": 2.0, "n": -2.0, "u": 7.0}
    assert p.bounds == {"a": (1.0, 50.0), "q": (0.0, math.inf), "n": (-math.inf, -1.0)}
    assert all(isinstance(v, float) for v in p.constants.values())


def test_with_constants_writes_bounds_back_and_they_survive_reparsing():
    p = parse_program(BOUNDED)
    fitted = p.with_constants({"a": 49.0, "q": 0.0, "b": -4.0}, header="seed=1")
    assert '"a": {"start": 49.0, "min": 1.0, "max": 50.0}' in fitted.source
    assert '"q": {"start": 0.0, "min": 0.0}' in fitted.source
    assert '"n": {"start": -2.0, "max": -1.0}' in fitted.source
    assert '"b": -4.0,' in fitted.source and '"u": 7.0,' in fitted.source  # plain constants stay plain
    again = parse_program(fitted.source)
    assert again.bounds == p.bounds
    assert again.constants == {"a": 49.0, "b": -4.0, "q": 0.0, "n": -2.0, "u": 7.0}
    assert again.with_constants(again.constants).source == fitted.source  # a fixed point


def test_with_constants_refuses_a_value_outside_its_bounds():
    p = parse_program(BOUNDED)
    for values in ({"a": 0.99}, {"a": 50.5}, {"q": -1e-9}, {"n": 0.0}):
        with pytest.raises(ProgramError) as e:
            p.with_constants(values)
        assert (
            e.value.rule == "constants" and next(iter(values)) in str(e.value) and "outside its bounds" in str(e.value)
        )
    assert p.clip({"a": 0.5, "q": -3.0, "n": 5.0, "b": -7.0}) == {"a": 1.0, "q": 0.0, "n": -1.0, "b": -7.0}


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('{"start": 1.0, "min": 3.0, "max": 2.0}', "min 3.0 must be below max 2.0"),
        ('{"start": 2.0, "min": 2.0, "max": 2.0}', "must be below max"),
        ('{"start": 0.5, "min": 1.0}', "start 0.5 is outside [1.0, inf]"),
        ('{"start": 60.0, "min": 1.0, "max": 50.0}', "start 60.0 is outside [1.0, 50.0]"),
        ('{"start": 1.0, "low": 0.0}', "unknown key 'low'"),
        ('{"start": 1.0, "max": "big"}', "'max' must be a finite number"),
        ('{"start": 1.0, "min": 1e999}', "'min' must be a finite number"),
        ('{"start": 1.0, "max": c}', "'max' must be a finite number"),
        ('{"min": 0.0, "max": 5.0}', 'needs a "start" value'),
        ('{"start": 1.0, "start": 2.0}', "'start' given twice"),
    ],
)
def test_bad_bounds_are_rejected_naming_the_line_and_the_rule(text, fragment):
    with pytest.raises(ProgramError) as e:
        parse_program(_with_constant(text))
    assert e.value.rule == "constants" and e.value.line == 2, str(e.value)
    assert fragment in e.value.message and "'a'" in e.value.message


def test_fit_of_a_file_with_bad_bounds_exits_2_with_one_line_naming_it_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(_with_constant('{"start": 0.5, "min": 1.0, "max": 50.0}'))
    out = tmp_path / "bad.fitted.py"
    res = CliRunner().invoke(app, ["fit", str(bad), "--max-evals", "4", "--out", str(out)])
    only_error_line(res, str(bad), "line 2", "start 0.5 is outside")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.py"]


# ---- CMA coordinates ----


def test_bounds_map_to_cma_coordinates_log_for_positive_constants_linear_across_zero():
    x0 = np.array([1.5, 2.0, 5.0, -2.0, 3.0])
    lo = np.array([1.0, 0.0, -1.0, -np.inf, -np.inf])
    hi = np.array([50.0, np.inf, 10.0, -1.0, np.inf])
    tf = Coordinates(x0, lo, hi)
    assert tf.bounded and tf.log.tolist() == [True, True, False, False, True]  # min < 0: searched linearly
    clo, chi = tf.cma_bounds()
    np.testing.assert_array_equal(clo, [0.0, -np.inf, -1.0 / 5.0, -np.inf, -np.inf])
    np.testing.assert_array_equal(chi, [math.log(50.0), np.inf, 10.0 / 5.0, -1.0 / 2.0, np.inf])
    # values read back never leave the bounds, even where exp(log(x)) misses x by an ulp
    back = tf.from_cma(clo.clip(-50, None))
    assert back[0] == 1.0 and back[2] == -1.0
    assert np.all(tf.from_cma(np.array([-9.0, -800.0, -9.0, 9.0, 1.0])) >= np.where(np.isfinite(lo), lo, -np.inf))
    unbounded = Coordinates(x0)
    assert not unbounded.bounded and unbounded.log.tolist() == [True, True, True, False, True]


# ---- fitting ----


def _oracle_variants():
    """The synthetic oracle with its other constants written in as numbers (their true values) and
    two left to fit, each started off its true value past a bound: base_us above its true 2500 and
    bounded below at 3800, c_memory below its true 1.45 and bounded above at 1.2; and the same
    program unbounded, both starting at the same point."""
    oracle = parse_program(ORACLE_SOURCE)
    functions = ORACLE_SOURCE[ORACLE_SOURCE.index("def step_time") :]
    for name, value in oracle.constants.items():
        if name not in ("base_us", "c_memory"):
            functions = functions.replace(f"c.{name}", repr(value))
    plain = 'CONSTANTS = {"base_us": 4000.0, "c_memory": 1.0}\n\n' + functions
    bounded = plain.replace('"base_us": 4000.0', '"base_us": {"start": 4000.0, "min": 3800.0, "max": 40000.0}').replace(
        '"c_memory": 1.0', '"c_memory": {"start": 1.0, "min": 0.5, "max": 1.2}'
    )
    assert list(parse_program(plain).constants) == ["base_us", "c_memory"]
    return parse_program(plain), parse_program(bounded)


@pytest.mark.parametrize(
    "method, evals, solve", [("trust-region", 12, False), ("trust-region", 12, True), ("cmaes", 40, False)]
)
def test_both_fit_methods_keep_constants_inside_bounds_the_unbounded_fit_leaves(
    synthetic_full, method, evals, solve, monkeypatch
):
    """With the linear solve too: base_us is affine, c_memory (inside max()) is not, and the two
    trade off, so a solve that held base_us while c_memory moved would stall short of the bounds."""
    exps = (
        synthetic_full.experiments
    )  # where the unbounded optimum lies outside the bounds (not so on the small sample)
    plain, bounded = _oracle_variants()
    assert set(bounded.bounds) == {"base_us", "c_memory"}
    # the floor off: the unbounded fit may take c_memory below 1 (faster than the HBM allows), which
    # is what shows the bounds at work here
    cfg = FitConfig(seed=3, max_evals=evals, method=method, linear_solve=solve, floor=False)
    with ReplayPool(exps, 2) as pool:
        free = fit_constants(plain, exps, pool, cfg).constants["all"]
        # every point CMA-ES proposes is inside the bounds before the final ulp clip: pycma's bound
        # handling keeps it there, not a clip of the candidates
        raw_from_cma, proposed = Coordinates.from_cma, []

        def unclipped(self, x):
            if self.bounded:
                proposed.append(np.where(self.log, np.exp(np.asarray(x, dtype=float)), np.asarray(x) * self.scale))
            return raw_from_cma(self, x)

        monkeypatch.setattr(Coordinates, "from_cma", unclipped)
        # a warm start outside the bounds (as a parent's constants may be) is moved inside first
        held = fit_constants(bounded, exps, pool, cfg, start={"base_us": 1000.0, "c_memory": 3.0})
    assert free["base_us"] < 3800.0 and free["c_memory"] > 1.2, free  # the unbounded optimum lies outside
    names = list(bounded.constants)
    i, j = names.index("base_us"), names.index("c_memory")
    assert len(proposed) > evals
    assert all(
        3800.0 * (1 - 1e-12) <= v[i] <= 40000.0 * (1 + 1e-12) and 0.5 * (1 - 1e-12) <= v[j] <= 1.2 * (1 + 1e-12)
        for v in proposed
    )
    assert min(v[i] for v in proposed) < 3900.0 and max(v[j] for v in proposed) > 1.15  # the search pressed on them
    assert held.start["base_us"] == 3800.0 and held.start["c_memory"] == 1.2
    c = held.constants["all"]
    assert 3800.0 <= c["base_us"] <= 40000.0 and 0.5 <= c["c_memory"] <= 1.2, c
    assert all(h[1] <= held.history[0][1] for h in held.history)
    bounded.with_constants(c)  # fitted values always write back


def test_a_bounded_fit_is_the_same_whatever_the_worker_count(synthetic):
    _, bounded = _oracle_variants()
    results = []
    for workers in (1, 2):
        with ReplayPool(synthetic.experiments, workers) as pool:
            results.append(fit_constants(bounded, synthetic.experiments, pool, FitConfig(seed=5, max_evals=8)))
    assert results[0].constants == results[1].constants and results[0].history == results[1].history


def test_fit_command_writes_the_bounds_into_the_fitted_program(tmp_path):
    out = tmp_path / "roofline.fitted.py"
    res = CliRunner().invoke(
        app, ["fit", str(seed_path("roofline")), "--seed", "2", "--max-evals", "8", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    seed, fitted = load_program(seed_path("roofline")), load_program(out)
    assert fitted.bounds == seed.bounds and fitted.bounds
    assert all(lo <= fitted.constants[k] <= hi for k, (lo, hi) in fitted.bounds.items())


# ---- seeds ----

OVERLAPPED = {"c_light_compute"}


def test_seeds_declare_physical_bounds_and_start_inside_them():
    for p in seed_paths():
        prog = load_program(p)
        assert set(prog.bounds) == set(prog.constants), f"{p.name}: every seed constant is bounded"
        for k, (lo, hi) in prog.bounds.items():
            assert lo <= prog.constants[k] <= hi and lo >= 0.0, (p.name, k)
            if k.startswith(("c_", "beta_")) and "_us" not in k:  # a multiplier of a time at the hardware's peak
                # >= 1, except compute a light step adds to its reads (extra time, >= 0; the floor holds it)
                assert lo == (0.0 if k in OVERLAPPED else 1.0), (p.name, k)
        for k in ("queue_us", "out_tok_us"):
            if k in prog.bounds:
                assert math.isfinite(prog.bounds[k][1]), (p.name, k)


# ---- symbolic operators ----


def _bounded_parent():
    prog = load_program(seed_path("trained_physics"))
    # the parent's fitted values sit on their bounds, so any perturbation would leave them
    values = {
        k: (lo if i % 2 else (hi if math.isfinite(hi) else lo)) for i, (k, (lo, hi)) in enumerate(prog.bounds.items())
    }
    return prog, values


def test_symbolic_children_keep_the_bounds_of_the_constants_they_keep():
    parent, values = _bounded_parent()
    made = 0
    for operator in OPERATORS:
        if operator == "crossover":
            continue
        for seed in range(6):
            try:
                text, _ = mutate(operator, parent, values, random.Random(seed))
            except NotRepresentable:
                continue
            child = parse_program(text)
            made += 1
            for k, v in child.constants.items():
                if k in parent.constants:
                    assert child.bounds.get(k) == parent.bounds[k], (operator, k)
                    lo, hi = parent.bounds[k]
                    assert lo <= v <= hi, (operator, k, v)
                else:  # a new ephemeral constant is unbounded
                    assert k not in child.bounds, (operator, k)
    assert made >= 20


def test_the_constants_operator_stays_inside_the_bounds():
    parent, values = _bounded_parent()
    moved = 0
    for seed in range(20):
        text, _ = mutate("constants", parent, values, random.Random(seed))
        child = parse_program(text)
        assert child.bounds == parent.bounds
        for k, (lo, hi) in child.bounds.items():
            assert lo <= child.constants[k] <= hi, (seed, k)
        moved += sum(child.constants[k] != values[k] for k in values)
    assert moved > 0  # values inside the bounds still move


def test_crossover_keeps_the_other_parents_bounds_for_constants_taken_from_it():
    parent, values = _bounded_parent()
    other = parse_program(
        '"""Other."""\nCONSTANTS = {"w_scale": {"start": 3.0, "min": 2.0, "max": 9.0}, "k_plain": 5.0}\n\n'
        "def step_time(f, c):\n    return c.w_scale * f.weights + c.k_plain * f.n_req\n\n"
        "def queueing_time(r, c):\n    return 100.0\n"
    )
    taken = 0
    for seed in range(40):
        try:
            text, _ = mutate("crossover", parent, values, random.Random(seed), other, {"w_scale": 2.0, "k_plain": 5.0})
        except NotRepresentable:
            continue
        child = parse_program(text)
        for k in child.constants:
            expected = other.bounds.get(k) if k in other.constants else parent.bounds.get(k)
            assert child.bounds.get(k) == expected, (seed, k)
        taken += "w_scale" in child.constants
    assert taken > 0


# ---- Go emission and the prompt ----


def test_emit_go_of_a_bounded_program_equals_that_of_the_same_program_with_plain_constants():
    for p in seed_paths():
        prog = load_program(p)
        plain = parse_program(_plain(prog))
        assert not plain.bounds and plain.constants == prog.constants
        assert go_source(prog) == go_source(plain), p.name


def test_the_llm_is_told_what_bounds_mean():
    from stepml_evolve.evaluator.hardware.components import COMPONENTS
    from stepml_evolve.evolve.search.llm_operator import prompt_templates

    text = prompt_templates().get_template("system.j2").render(components=COMPONENTS, budget_tokens=2048, max_seqs=128)
    assert '{"start": 1.5, "min": 1.0, "max": 50.0}' in text and ">= 1" in text and ">= 0" in text
