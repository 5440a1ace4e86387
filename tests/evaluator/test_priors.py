"""Priors for what the data cannot identify: stated in a program's CONSTANTS, paid for in every fit,
documented per seed with their sources, and reported per constant by `evolve fit`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import ROOT
from typer.testing import CliRunner

from stepml_evolve.evaluator.dsl import ProgramError, load_program, parse_program
from stepml_evolve.evaluator.dsl.program import PRIOR_WEIGHT, prior_penalty
from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants
from stepml_evolve.evaluator.fit.identifiability import VERDICTS, _verdict, identify
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.search.cascade import structure_hash
from stepml_evolve.seeds import baseline_paths, priors_markdown, seed_path, seed_paths, seed_priors

WITH_PRIOR = '''"""p"""
CONSTANTS = {{
    "o": {{"start": 1500.0, "min": 0.0, "prior": 1500.0, "spread": 0.7}},
    "c_memory": {{"start": 1.2, "min": 1.0, "max": 100.0, "prior": 1.2, "spread": 0.12}},
    "k": {k},
}}


def step_time(f, c):
    return c.o + max(1.45 * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc), c.c_memory * (f.weights + f.kv_read + f.kv_write)) + f.allreduce + c.k * f.experts


def output_token_time(c):
    return 45.0
'''


def test_a_prior_is_parsed_rendered_and_kept_through_new_constants():
    p = parse_program(WITH_PRIOR.format(k='{"start": 10.0, "min": 0.0, "prior": 3.0, "spread": 0.5}'))
    assert p.priors["k"].centre == 3.0 and p.priors["k"].spread == 0.5 and p.priors["k"].relative
    moved = p.with_constants({"k": 7.0})
    assert moved.priors == p.priors and moved.constants["k"] == 7.0
    assert parse_program(moved.source).priors == p.priors
    assert structure_hash(p) != structure_hash(parse_program(WITH_PRIOR.format(k="10.0")))


@pytest.mark.parametrize(
    "k, message",
    [
        ('{"start": 1.0, "min": 0.0, "max": 5.0, "prior": 9.0, "spread": 0.5}', "prior 9.0 contradicts its bounds"),
        ('{"start": 1.0, "prior": 2.0}', 'needs both "prior" and "spread"'),
        ('{"start": 1.0, "spread": 0.5}', 'needs both "prior" and "spread"'),
        ('{"start": 1.0, "prior": 2.0, "spread": 0.0}', "spread 0.0 must be above 0"),
        ('{"start": 1.0, "prior": 2.0, "spread": -1.0}', "must be above 0"),
    ],
)
def test_a_bad_prior_is_a_one_line_error_naming_the_constant(k, message):
    with pytest.raises(ProgramError) as info:
        parse_program(WITH_PRIOR.format(k=k))
    assert "'k'" in str(info.value) and message in str(info.value) and "\n" not in str(info.value)


def test_a_relative_prior_pays_its_squared_distance_in_spreads_of_ln_value():
    p = parse_program(WITH_PRIOR.format(k='{"start": 3.0, "min": 0.0, "prior": 3.0, "spread": 0.5}'))
    at_prior = np.array([[1500.0, 1.2, 3.0]])
    assert prior_penalty(p, at_prior)[0] == 0.0
    one_spread = np.array([[1500.0, 1.2, 3.0 * math.exp(0.5)]])
    assert prior_penalty(p, one_spread)[0] == pytest.approx(PRIOR_WEIGHT)
    absolute = parse_program(WITH_PRIOR.format(k='{"start": 0.0, "min": -5.0, "prior": 0.0, "spread": 2.0}'))
    assert not absolute.priors["k"].relative
    assert prior_penalty(absolute, np.array([[1500.0, 1.2, -4.0]]))[0] == pytest.approx(4.0 * PRIOR_WEIGHT)


def test_a_constant_the_data_cannot_see_stays_at_its_prior_and_the_profile_says_so(synthetic):
    # the synthetic sample's Mixtral makes f.experts vary little relative to the rest; a dense-only
    # subset leaves k * f.experts at 0 in every step: nothing but the prior can decide k
    dense = [e for e in synthetic.experiments if not e.arch.moe][:2]
    k = '{"start": 10.0, "min": 0.0, "prior": 3.0, "spread": 0.5}'
    with_prior = parse_program(WITH_PRIOR.format(k=k))
    without = parse_program(WITH_PRIOR.format(k='{"start": 10.0, "min": 0.0}'))
    config = FitConfig(seed=1, max_evals=10)
    with ReplayPool(dense) as pool:
        held = fit_constants(with_prior, dense, pool, config)
        free = fit_constants(without, dense, pool, config)
        reports = {r.name: r for r in identify(with_prior, held.constants["all"], dense, pool, config)}
        unheld = {r.name: r for r in identify(without, free.constants["all"], dense, pool, config)}
    assert held.constants["all"]["k"] == pytest.approx(3.0, rel=0.2)
    assert free.constants["all"]["k"] != pytest.approx(3.0, rel=0.2)
    assert held.penalties["all"] >= 0 and math.isfinite(held.loss)
    assert reports["k"].verdict == "held by its prior" and reports["k"].data_curvature == 0.0
    assert reports["o"].verdict in VERDICTS
    assert unheld["k"].verdict == "unidentified"


def test_a_verdict_names_what_decided_the_constant():
    assert _verdict(10.0, 1.0, object(), None, 0.0, 1.0, (0, 2))[0] == "identified"
    assert _verdict(1.0, 1.0, object(), None, 0.0, 1.0, (0, 2))[0] == "weak"
    assert _verdict(0.01, 1.0, object(), None, 0.0, 1.0, (0, 2))[0] == "held by its prior"
    verdict, why = _verdict(0.0, 0.0, None, "min", 0.5, 1.0, (1.0, 100.0))
    assert verdict == "held by its bound" and "the data would take it below its min" in why
    verdict, why = _verdict(0.0, 0.0, None, "min", -0.5, 1.0, (1.0, 100.0))
    assert verdict == "held by its bound" and "not by the data" in why


def test_every_shipped_seed_and_baseline_constant_carries_the_prior_its_quantity_documents():
    table = seed_priors()
    quantities = table["quantities"]
    for path in seed_paths() + baseline_paths():
        program = load_program(path)
        named = table["constants"][path.stem]
        assert set(named) == set(program.constants), path.stem
        for constant, quantity in named.items():
            prior, q = program.priors[constant], quantities[quantity]
            assert (prior.centre, prior.spread) == (q["centre"], q["spread"]), (path.stem, constant)
            assert program.constants[constant] == prior.centre, (path.stem, constant)  # each starts at its centre
            assert q["source"] and q["unit"]


def test_the_priors_page_is_the_table_generated_from_the_seeds_file():
    page = (ROOT / "docs" / "concepts" / "priors.md").read_text()
    assert priors_markdown() in page


def test_fit_prints_what_decided_each_constant(tmp_path):
    res = CliRunner().invoke(
        app, ["fit", str(seed_path("roofline")), "--out", str(tmp_path / "r.py"), "--max-evals", "3", "--json"]
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    rows = {r["name"]: r for r in report["identifiability"]["all"]}
    assert set(rows) == set(load_program(seed_path("roofline")).constants)
    assert all(r["verdict"] in VERDICTS for r in rows.values())
    assert rows["c_compute"]["prior"] == {"centre": 1.45, "spread": 0.12}
    on_bound = [r for r in rows.values() if r["bound"]]
    assert all(r["verdict"] == "held by its bound" and r["why"] for r in on_bound)
    assert report["prior_penalty"]["all"] >= 0
    text = CliRunner().invoke(
        app, ["fit", str(seed_path("roofline")), "--out", str(tmp_path / "r2.py"), "--max-evals", "3"]
    )
    assert "what decided each constant" in text.stdout and "from the priors" in text.stdout
