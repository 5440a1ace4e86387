"""The `switch` operator: a change of regime at a fitted threshold of a step's count, opt-in per run."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import archived_children, roofline_children, tiny_run

from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.dsl.numexpr_compile import step_times
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX, N_COMPONENTS
from stepml_evolve.evolve.search.emitters import OPERATOR_WEIGHTS, operator_weights
from stepml_evolve.evolve.search.symbolic import SWITCH_COUNTS, TYPICAL_COUNT, term_start
from stepml_evolve.seeds import seed_path

SCALED = re.compile(r"switch on step_time: f\.(\w+) \* k above f\.(\w+) > t \(new constants: (\w+), (\w+)\)")
GATED = re.compile(r"switch on step_time: \+ (k|k \* f\.(\w+)) above f\.(\w+) > t \(new constants: (\w+), (\w+)\)")


def test_a_switched_child_is_its_parent_with_a_regime_above_a_threshold():
    # roofline holds each time component once, so the child's change is one column scaled, or one
    # term added, on the steps whose count is above the threshold, and nothing on the others
    parent = load_program(seed_path("roofline"))
    rng = np.random.default_rng(1)
    comps = rng.uniform(0.0, 500.0, size=(N_COMPONENTS, 400))
    for count, typical in TYPICAL_COUNT.items():  # counts on both sides of every starting threshold
        comps[COMPONENT_INDEX[count]] = np.floor(rng.uniform(0.0, 8.0 * typical, size=400))
    base = step_times(parent, comps, np.array(list(parent.constants.values())))
    kinds = set()
    for _, child, detail in roofline_children("switch", 40):
        values = np.array(list(child.constants.values()))
        got = step_times(child, comps, values)
        if m := SCALED.fullmatch(detail):
            component, count, t, k = m.groups()
            assert child.constants[k] == 1.1
            above = comps[COMPONENT_INDEX[count]] > child.constants[t]
            scaled = comps.copy()
            scaled[COMPONENT_INDEX[component]] *= np.where(above, child.constants[k], 1.0)
            expected = step_times(parent, scaled, np.array(list(parent.constants.values())))
            kinds.add("scaled")
        else:
            _, extra, count, t, k = GATED.fullmatch(detail).groups()
            assert child.constants[k] == (term_start(f"f.{extra}") if extra else 10.0)  # add_term's start
            above = comps[COMPONENT_INDEX[count]] > child.constants[t]
            term = child.constants[k] * (comps[COMPONENT_INDEX[extra]] if extra else 1.0)
            expected = base + np.where(above, term, 0.0)
            kinds.add("gated")
        assert count in SWITCH_COUNTS
        assert TYPICAL_COUNT[count] / 4 <= child.constants[t] <= TYPICAL_COUNT[count] * 4
        assert 0 < above.sum() < above.size, (detail, child.constants[t])
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=detail)
    assert kinds == {"scaled", "gated"}


def test_switch_is_off_unless_a_run_asks_for_a_share_and_shares_with_modulate():
    assert operator_weights(0.0, 0.0) == OPERATOR_WEIGHTS and "switch" not in OPERATOR_WEIGHTS
    weights = operator_weights(0.1, 0.2)
    rest = sum(OPERATOR_WEIGHTS.values()) * 0.7
    assert weights["modulate"] == 0.1 and weights["switch"] == 0.2
    assert sum(weights.values()) == pytest.approx(rest + 0.3, abs=1e-12)
    assert operator_weights(0.15) == operator_weights(0.15, 0.0) and "switch" not in operator_weights(0.15)


def test_a_run_with_switch_archives_switched_children_and_resumes_only_with_the_same_share(tmp_path):
    res = tiny_run(tmp_path, 2, "--switch", "0.8")
    assert res.exit_code == 0, res.output
    rows = archived_children(tmp_path, "switch")
    assert rows, "no switched child reached the archive"
    for source, detail in rows:
        m = SCALED.search(detail) or GATED.search(detail)
        count, t = (m.group(2), m.group(3)) if m.re is SCALED else (m.group(3), m.group(4))
        assert f"if f.{count} > c.{t} else" in source
    res = tiny_run(tmp_path, 3, "--switch", "0.3", "--resume")
    assert res.exit_code == 2 and "switch: run 0.8, now 0.3" in res.stderr
    res = tiny_run(tmp_path / "both", 1, "--switch", "0.6", "--modulate", "0.5")
    assert res.exit_code == 2 and "--switch" in res.stderr and "less than 1" in res.stderr
    assert not (tmp_path / "both" / "archive.sqlite").exists()
