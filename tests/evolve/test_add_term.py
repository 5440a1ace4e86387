"""The `add_term` operator: the parent plus one fitted term k * x, whose k starts near the parent."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import roofline_children

from stepml_evolve.evaluator.dsl import compile_program, load_program, parse_program
from stepml_evolve.evaluator.dsl.numexpr_compile import step_times
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX, N_COMPONENTS, TIME_COMPONENTS
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.search.symbolic import (
    COUNT_COMPONENTS,
    TERM_START_US,
    TYPICAL_COUNT,
    TYPICAL_REQUEST,
    term_start,
)
from stepml_evolve.seeds import seed_path

DETAIL = re.compile(r"add_term on (step_time|queueing_time): \+ k \* ([fr])\.(\w+) \(new constants: (\w+)\)")


def test_an_add_term_child_is_its_parent_plus_one_term_at_its_starting_constant():
    parent = load_program(seed_path("roofline"))
    comps = np.random.default_rng(0).uniform(0.0, 500.0, size=(N_COMPONENTS, 200))
    base = step_times(parent, comps, np.array(list(parent.constants.values())))
    seen = set()
    for text, child, detail in roofline_children("add_term", 60):
        function, kind, name, k = DETAIL.fullmatch(detail).groups()
        seen.add((function, name))
        start = child.constants[k]
        assert start == term_start(f"{kind}.{name}")
        if name in TIME_COMPONENTS:
            assert start == 1.0  # the term starts at that component's own time
        else:  # a count or a request field: TERM_START_US at its typical size
            typical = TYPICAL_COUNT[name] if kind == "f" else TYPICAL_REQUEST[name]
            assert start * typical == pytest.approx(TERM_START_US, rel=1e-3)
        if function == "step_time":
            got = step_times(child, comps, np.array(list(child.constants.values())))
            np.testing.assert_allclose(got, base + start * comps[COMPONENT_INDEX[name]], rtol=1e-12, err_msg=detail)
        else:
            assert f"c.{k} * r.{name}" in text
    assert {f for f, _ in seen} == {"step_time", "queueing_time"}
    assert any(n in COUNT_COMPONENTS for _, n in seen) and any(n in TIME_COMPONENTS for _, n in seen)


def _with_term(parent, name: str, k: float):
    """The roofline seed plus k * f.name, as add_term writes it."""
    text = parent.source.replace("+ f.allreduce\n", f"+ f.allreduce + c.k_new * f.{name}\n")
    text = text.replace("CONSTANTS = {", f'CONSTANTS = {{\n    "k_new": {k!r},', 1)
    return parse_program(text)


def test_a_new_count_term_starts_near_its_parent_where_a_start_of_k_10_did_not(synthetic):
    """At the start of its fit, an add_term child adds TERM_START_US at the count's typical size, so
    it starts near its parent on every count; at k = 10 (every count's start before) a term in a
    step's context sum or its longest context started at many times the parent's loss, and no
    screening fit came back from it (docs/HISTORY.md, "New terms start small")."""
    parent = load_program(seed_path("roofline"))
    exps = synthetic.experiments
    with ReplayPool(exps) as pool:

        def loss(program) -> float:
            vec = np.array(list(program.constants.values()))
            return pool.population_losses(compile_program(program), [vec], exps)[0]

        own = loss(parent)
        now = {n: loss(_with_term(parent, n, term_start(f"f.{n}"))) for n in COUNT_COMPONENTS}
        before = {n: loss(_with_term(parent, n, 10.0)) for n in ("ctx_sum", "ctx_max")}
    assert all(v < own + 0.5 * own for v in now.values()), (own, now)
    assert all(v > 3 * own for v in before.values()), (own, before)
