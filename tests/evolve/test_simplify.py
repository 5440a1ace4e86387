"""A child is simplified before its fit (evolve/search/simplify.py): repeated terms merged, redundant
constants folded, so the archive's front holds distinct physics."""

from __future__ import annotations

import pytest

from stepml_evolve.evaluator.dsl import check_units, load_program, parse_program
from stepml_evolve.evolve.search.simplify import simplify
from stepml_evolve.seeds import seed_paths

CHILD = '''"""c"""
CONSTANTS = {{
    "c_compute": {{"start": 1.5, "min": 1.0, "max": 100.0, "prior": 1.45, "spread": 0.12}},
    "k1": {{"start": 2.0, "prior": 2.0, "spread": 2.3}},
    "k2": {{"start": 0.01, "prior": 0.01, "spread": 2.3}},
    "k3": {{"start": 0.02, "prior": 0.02, "spread": 2.3}},
    "o": 100.0,
    "o2": 50.0,
}}


def step_time(f, c):
    return {expr}
'''
ROOF = "max(c.c_compute * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc), f.weights + f.kv_read + f.kv_write)"


def child(expr: str):
    return parse_program(CHILD.format(expr=expr))


def test_a_repeated_term_is_merged_into_the_first_constant():
    program, notes = simplify(child(f"c.o + {ROOF} + c.k2 * f.ctx_sum + c.k3 * f.ctx_sum"))
    assert "k3" not in program.constants and program.constants["k2"] == pytest.approx(0.03)
    assert ast_count(program, "f.ctx_sum") == 1 and notes == ["merged the repeated term c.k3 * f.ctx_sum into c.k2's"]


def test_the_same_term_twice_is_one_term_with_twice_its_constant():
    program, _ = simplify(child(f"c.o + {ROOF} + c.k2 * f.ctx_sum + c.k2 * f.ctx_sum"))
    assert ast_count(program, "f.ctx_sum") == 1 and program.constants["k2"] == pytest.approx(0.02)


def test_constants_in_one_product_fold_into_the_one_with_the_tightest_prior():
    program, notes = simplify(child(f"c.o + max(c.k1 * c.c_compute * f.gemm_pf, f.weights) + {ROOF}"))
    assert "k1" not in program.constants and "c_compute" in program.constants
    assert program.constants["c_compute"] == pytest.approx(3.0)  # 2.0 * 1.5, inside [1, 100]
    assert program.bounds["c_compute"] == (1.0, 100.0) and program.priors["c_compute"].spread == 0.12
    assert notes == ["folded c.k1 * c.c_compute into c.c_compute"]


def test_bare_constants_of_a_sum_are_one():
    program, _ = simplify(child(f"c.o + {ROOF} + c.o2"))
    assert "o2" not in program.constants and program.constants["o"] == pytest.approx(150.0)


def test_opposite_signs_and_different_shapes_are_left_alone():
    for expr in (
        f"c.o + {ROOF} + c.k2 * f.ctx_sum - c.k3 * f.ctx_sum",
        f"c.o + {ROOF} + c.k2 * f.ctx_sum + c.k3 * f.ctx_max",
    ):
        p = child(expr)
        same, notes = simplify(p)
        assert same is p and notes == []


def test_the_seeds_have_nothing_to_simplify():
    for path in seed_paths():
        p = load_program(path)
        assert simplify(p) == (p, []), path.stem


def test_a_simplified_child_still_checks_its_units():
    program, notes = simplify(child(f"c.o + {ROOF} + c.k2 * f.ctx_sum + c.k3 * f.ctx_sum + c.o2"))
    assert len(notes) == 2
    check_units(program)


def ast_count(program, name: str) -> int:
    return program.source.count(name)
