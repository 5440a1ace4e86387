"""The `modulate` operator: one time component scaled by (1 + k * n) or (1 + k / n), opt-in per run."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import archived_children, roofline_children, tiny_run

from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.dsl.numexpr_compile import step_times
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX, N_COMPONENTS
from stepml_evolve.evolve.search.emitters import OPERATOR_WEIGHTS, operator_weights
from stepml_evolve.evolve.search.symbolic import TYPICAL_COUNT
from stepml_evolve.seeds import seed_path

DETAIL = re.compile(r"modulate on step_time: f\.(\w+) \* \(1 \+ k ([*/]) f\.(\w+)\) \(new constants: (\w+)\)")


def test_a_modulated_child_is_its_parent_with_one_component_scaled_by_a_count():
    # roofline holds each time component once, so scaling that column is the child's change
    parent = load_program(seed_path("roofline"))
    rng = np.random.default_rng(0)
    comps = rng.uniform(0.0, 500.0, size=(N_COMPONENTS, 400))
    comps[:, :40] = np.floor(comps[:, :40] / 100.0)  # counts of zero and one: k / 0 adds nothing
    shapes = set()
    for _, child, detail in roofline_children("modulate", 30):
        component, shape, count, k = DETAIL.fullmatch(detail).groups()
        shapes.add(shape)
        start = child.constants[k]
        assert start * (TYPICAL_COUNT[count] if shape == "*" else 1.0 / TYPICAL_COUNT[count]) == pytest.approx(0.1)
        n = comps[COMPONENT_INDEX[count]]
        with np.errstate(divide="ignore"):
            factor = 1.0 + start * n if shape == "*" else np.where(n != 0.0, 1.0 + start / n, 1.0)
        scaled = comps.copy()
        scaled[COMPONENT_INDEX[component]] *= factor
        expected = step_times(parent, scaled, np.array(list(parent.constants.values())))
        got = step_times(child, comps, np.array(list(child.constants.values())))
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=detail)
    assert shapes == {"*", "/"}


def test_modulate_is_off_unless_a_run_asks_for_a_share_of_the_children():
    assert operator_weights(0.0) == OPERATOR_WEIGHTS and "modulate" not in OPERATOR_WEIGHTS
    weights = operator_weights(0.25)
    assert (
        weights["modulate"] == 0.25
        and abs(sum(weights.values()) - sum(OPERATOR_WEIGHTS.values()) * 0.75 - 0.25) < 1e-12
    )


def test_a_run_with_modulate_archives_modulated_children_and_resumes_only_with_the_same_share(tmp_path):
    res = tiny_run(tmp_path, 2, "--modulate", "0.8")
    assert res.exit_code == 0, res.output
    rows = archived_children(tmp_path, "modulate")
    assert rows, "no modulated child reached the archive"
    for source, detail in rows:
        component, shape, count, k = DETAIL.search(detail).groups()
        assert f"f.{component} * (1.0 + c.{k} {shape} f.{count})" in source
    res = tiny_run(tmp_path, 3, "--modulate", "0.3", "--resume")
    assert res.exit_code == 2 and "modulate: run 0.8, now 0.3" in res.stderr
    res = tiny_run(tmp_path, 3, "--modulate", "1.5")
    assert res.exit_code == 2 and "--modulate" in res.stderr
