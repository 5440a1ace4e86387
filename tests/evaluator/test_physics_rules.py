"""Physics a program cannot trade away beyond the floor (evaluator/physics/rules.py): causal inputs, no
subtracted time, one role per constant; and what a search does with them (inherited bounds and
priors, refused children, causal operators)."""

from __future__ import annotations

import math
import random

import pytest

from stepml_evolve.evaluator.dsl import load_program, parse_program
from stepml_evolve.evaluator.physics.rules import DEFAULT_SPREAD, check_physics, inherit, physics_problems
from stepml_evolve.evolve.search.symbolic import OPERATORS, mutate
from stepml_evolve.seeds import seed_path

BASE = '''"""t"""
CONSTANTS = {{"o": 1000.0, "c_compute": {{"start": 1.45, "min": 1.0, "prior": 1.45, "spread": 0.12}}, "c_memory": 1.2, "k": 2.0, "q": 2000.0}}


def step_time(f, c):
    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc
    memory = f.weights + f.kv_read + f.kv_write
    return {step}


def queueing_time(r, c):
    return {queue}
'''
SOUND_STEP = "c.o + max(c.c_compute * compute, c.c_memory * memory) + f.allreduce"


def program(step: str = SOUND_STEP, queue: str = "c.q"):
    return parse_program(BASE.format(step=step, queue=queue))


def rules(p) -> list[str]:
    return [rule for rule, _ in physics_problems(p)]


def test_every_shipped_physics_seed_is_sound():
    for name in ("roofline", "trained_physics", "regime_switch", "phase_decomposed"):
        assert physics_problems(load_program(seed_path(name))) == [], name
    assert program().constants and rules(program()) == []


@pytest.mark.parametrize(
    "queue",
    ["c.q + c.k * r.output_tokens", "c.q * (1 + 0 * r.output_tokens)"],
)
def test_queueing_time_may_not_read_the_output_length(queue):
    problems = physics_problems(program(queue=queue))
    assert problems[0][0] == "causal" and "r.output_tokens" in problems[0][1] and "cannot cause" in problems[0][1]


def test_queueing_time_may_read_the_prompt_length_and_the_step_in_flight():
    assert rules(program(queue="c.q + c.k * r.input_tokens + 0.5 * r.last_step_us")) == []


@pytest.mark.parametrize(
    "step, ok",
    [
        (SOUND_STEP + " + c.k * f.tp", False),  # charges TP 1 by k
        ("(" + SOUND_STEP + ") * (1 + c.k * f.tp)", False),
        (SOUND_STEP + " + c.k * log(f.tp)", True),  # 0 at TP 1, as no TP at all
        ("c.o + max(c.c_compute * compute, c.c_memory * memory) + f.allreduce * (1 + c.k * f.tp)", True),
    ],
)
def test_a_tensor_parallel_term_must_be_zero_at_tp_1(step, ok):
    found = rules(program(step))
    assert (found == []) is ok, found
    if not ok:
        assert found[0] == "causal"


@pytest.mark.parametrize(
    "step",
    [
        SOUND_STEP + " - c.k * f.attn_dc",
        SOUND_STEP + " + (-1.0) * f.kv_write",
        SOUND_STEP + " + c.k / f.weights",
        SOUND_STEP + " + c.k * (f.gemm_pf) ** (-1)",
        "c.o + max(c.c_compute * compute, c.c_memory * memory) + f.allreduce + exp(-f.attn_pf / 1000)",
    ],
)
def test_a_time_component_may_not_be_subtracted_or_divide(step):
    problems = physics_problems(program(step))
    assert problems and problems[0][0] == "floor" and "faster for doing more" in problems[0][1]


def test_a_count_may_divide_and_a_time_may_be_scaled_by_a_count():
    assert rules(program(SOUND_STEP + " * (1 + c.k / f.n_req)")) == []


@pytest.mark.parametrize(
    "step, queue",
    [
        (SOUND_STEP + " + c.k * f.n_req + sqrt(c.c_compute) * 10", "c.q"),  # borrowed inside sqrt
        (SOUND_STEP + " + c.k * f.n_req + c.k * f.gemm_pf", "c.q"),  # a count's rate and a time's scale
        (SOUND_STEP, "c.q + c.o"),  # shared by step_time and queueing_time
        ("c.o + (max(c.c_compute * compute, c.c_memory * memory) if f.tok_pf > c.k else c.k * memory)", "c.q"),
    ],
)
def test_a_constant_has_one_role_in_one_function(step, queue):
    problems = physics_problems(program(step, queue))
    assert problems and problems[0][0] == "floor" and "two roles" in problems[0][1]


def test_one_constant_scaling_two_times_is_one_role():
    step = "c.o + c.c_compute * f.gemm_pf + c.c_compute * f.attn_pf + max(c.k * (f.gemm_dc + f.attn_dc), c.c_memory * memory) + f.allreduce"
    assert rules(program(step)) == []


def test_check_physics_raises_the_first_problem_as_a_one_line_program_error():
    with pytest.raises(Exception) as info:
        check_physics(program(queue="c.q + r.output_tokens"), origin="child.py")
    assert info.value.rule == "causal" and str(info.value).startswith("child.py: ")
    assert "\n" not in str(info.value)


def test_a_child_keeps_its_parents_bounds_and_priors_and_new_constants_get_a_weak_prior():
    parent = load_program(seed_path("roofline"))
    # an LLM's rewrite that loosens c_compute (min 0.1, a tighter prior at 1.0) and adds k_new
    loosened = parent.source.replace(
        '"c_compute": {"start": 1.45, "min": 1.0, "max": 100.0, "prior": 1.45, "spread": 0.12}',
        '"c_compute": {"start": 0.5, "min": 0.1, "prior": 1.0, "spread": 0.01}, "k_new": 30.0',
    ).replace("+ f.allreduce", "+ f.allreduce + c.k_new * f.n_req", 1)
    child = inherit(parse_program(loosened), parent)
    assert child.bounds["c_compute"] == parent.bounds["c_compute"]
    assert child.priors["c_compute"] == parent.priors["c_compute"]
    assert child.constants["c_compute"] == 1.0  # moved into the parent's bounds
    assert child.priors["k_new"].centre == 30.0 and child.priors["k_new"].spread == pytest.approx(DEFAULT_SPREAD)
    assert child.priors["k_new"].relative
    untouched = parse_program(parent.source)
    assert inherit(untouched, parent) is untouched


def test_a_causal_search_s_operators_draw_neither_the_tp_count_nor_the_output_length():
    parent = load_program(seed_path("roofline"))
    drawn = []
    for seed in range(120):
        for operator in ("subtree", "add_term", "modulate", "node_replace", "insert"):
            try:
                text, _ = mutate(operator, parent, dict(parent.constants), random.Random(seed), causal=True)
            except Exception:
                continue
            drawn.append(parse_program(text).inputs)
    assert len(drawn) > 300
    assert not any("f.tp" in d or "r.output_tokens" in d for d in drawn)
    # without the rule they are drawn (the operators of runs stored before it)
    free = []
    for seed in range(120):
        text, _ = mutate("add_term", parent, dict(parent.constants), random.Random(seed))
        free.append(parse_program(text).inputs)
    assert any("f.tp" in d or "r.output_tokens" in d for d in free)
    assert "add_term" in OPERATORS


def test_an_efficiency_of_one_resource_is_not_read_as_anothers():
    # an HBM efficiency scaling the all-reduce too (what a search's child did, attention_switch)
    step = "c.o + max(c.c_compute * compute, c.c_memory * memory) + c.c_memory * f.allreduce"
    problems = physics_problems(program(step))
    assert problems[0][0] == "floor" and "two roles" in problems[0][1]
    assert "HBM time" in problems[0][1] and "link time" in problems[0][1]
    # one efficiency over a whole roofline is one role (FLOP and HBM time)
    assert rules(program("c.o + c.k * max(compute, memory) + f.allreduce")) == []
    assert "two roles" in physics_problems(program("c.o + c.k * max(compute, memory) + c.k * f.allreduce"))[0][1]


def test_a_new_constant_read_in_a_value_is_no_less_than_zero():
    parent = load_program(seed_path("roofline"))
    text = parent.source.replace("+ f.allreduce\n", "+ f.allreduce + c.k1 * f.kv_read + c.k2 * f.n_req\n", 1)
    text = text.replace("CONSTANTS = {", 'CONSTANTS = {\n    "k1": -0.5,\n    "k2": 30.0,', 1)
    child = inherit(parse_program(text), parent)
    assert child.bounds["k1"] == (0.0, math.inf) and child.constants["k1"] == 0.0  # a negative one subtracts
    assert child.bounds["k2"] == (0.0, math.inf)  # a count's rate: negative, it takes time away per request


@pytest.mark.parametrize(
    "step",
    [
        "c.o + max(compute, c.c_memory * memory) + f.allreduce",  # c_compute dropped: prefill at the peak
        SOUND_STEP + " + f.attn_dc",  # extra decode attention, at the peak
        SOUND_STEP + " + f.attn_pf * f.n_pf",  # a time times a count, no efficiency
    ],
)
def test_no_flop_or_hbm_time_counts_at_the_hardware_s_peak(step):
    problems = physics_problems(program(step))
    assert any(rule == "floor" and "at the hardware's peak" in why for rule, why in problems)


@pytest.mark.parametrize(
    "step, time, count",
    [
        # a real search's best on the 16 experiments: decode attention once per layer, again
        (
            "c.o + max(c.c_compute * (compute + f.attn_dc * f.layers), c.c_memory * memory) + f.allreduce",
            "attn_dc",
            "layers",
        ),
        (SOUND_STEP + " + c.k * f.attn_pf * f.n_pf", "attn_pf", "n_pf"),
        (SOUND_STEP + " + c.k * f.weights * sqrt(f.ctx_max)", "weights", "ctx_max"),
        (SOUND_STEP + " + c.k * (f.n_req + 1) * f.kv_read", "kv_read", "n_req"),
        # the count multiplies a sum, a roofline or a branch that holds the time
        ("c.o + max(c.c_compute * compute, c.c_memory * memory) * f.n_req + f.allreduce", None, "n_req"),
        (
            "c.o + max(c.c_compute * compute, c.c_memory * memory) + c.k * (f.attn_dc + f.gemm_dc) * f.layers",
            "attn_dc",
            "layers",
        ),
        (SOUND_STEP + " + c.k * (f.kv_read if f.n_dc > 4 else f.kv_write) * f.n_dc", "kv_read", "n_dc"),
    ],
)
def test_a_time_multiplied_by_a_count_is_refused(step, time, count):
    problems = [why for rule, why in physics_problems(program(step)) if rule == "floor"]
    named = f"multiplies f.{time} by f.{count}" if time else f" by f.{count}: a time component"
    assert any(named in why for why in problems), problems


def test_a_count_in_a_divisor_or_a_condition_does_not_multiply_a_time():
    assert rules(program(SOUND_STEP + " + c.k * f.kv_read / f.n_dc")) == []  # a share per request
    assert rules(program(SOUND_STEP + " + c.k * f.kv_read * (2 if f.n_dc > 4 else 1)")) == []
    assert rules(program(SOUND_STEP + " + c.k * f.n_req")) == []  # a count's own rate


def test_every_time_scaled_by_a_constant_is_not_at_peak_nor_is_the_all_reduce():
    assert rules(program(SOUND_STEP + " + c.k * f.kv_read")) == []
    assert rules(program("c.o + c.k * max(compute, memory) + f.allreduce")) == []
    assert rules(program(SOUND_STEP + " + f.attn_dc / c.k")) == []  # an efficiency as a fraction
