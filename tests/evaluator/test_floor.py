"""The physical floor (evaluator/physics/floor.py): no program predicts a step faster than the roofline of
its work at the hardware's peak, on an envelope of steps users simulate; refused before any fit,
never crossed by one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import only_error_line
from typer.testing import CliRunner

from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.dsl import compile_program, load_program, parse_program
from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants
from stepml_evolve.evaluator.hardware.catalog import catalog
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX
from stepml_evolve.evaluator.physics.floor import (
    BUDGETS,
    DECODE_BATCHES,
    PREFILL_CHUNKS,
    FloorError,
    check_floor,
    envelope_for,
    floor_of,
)
from stepml_evolve.evaluator.replay.closed_loop import replay
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import baseline_path, seed_path

ROOFLINE_AT = '''"""Roofline at a fixed efficiency {k}."""
CONSTANTS = {{"k": {k}}}


def step_time(f, c):
    return c.k * (max(f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc, f.weights + f.kv_read + f.kv_write) + f.allreduce)
'''

SCALED = '''"""A roofline whose scale the fit may take anywhere (no bounds)."""
CONSTANTS = {"k": 1.5, "o": 100.0}


def step_time(f, c):
    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc
    memory = f.weights + f.kv_read + f.kv_write
    return c.k * max(compute, memory) + c.o + f.allreduce


def output_token_time(c):
    return 10.0
'''


def test_the_envelope_spans_every_catalog_model_gpu_and_tp_and_the_steps_users_simulate():
    env = envelope_for()
    cat = catalog()
    assert {d.model for d in env.deployments} == set(cat.models)
    assert {d.hardware.name for d in env.deployments} == set(cat.hardware)
    assert {d.tp for d in env.deployments} == {1, 2, 4, 8}
    assert min(PREFILL_CHUNKS) == 16 and max(PREFILL_CHUNKS) == 8192
    assert min(DECODE_BATCHES) == 1 and max(DECODE_BATCHES) == 512
    assert min(BUDGETS) == 64 and max(BUDGETS) == 16_384
    tok_pf, n_dc = env.components[COMPONENT_INDEX["tok_pf"]], env.components[COMPONENT_INDEX["n_dc"]]
    assert tok_pf.max() >= 16_000 and n_dc.max() == 512
    # a step is in the envelope only where its deployment's KV cache holds it
    for i in range(0, len(env), 97):
        assert env.steps[env.step[i]].kv_tokens <= env.deployments[env.deployment[i]].kv_tokens
    # CodeLlama-34B is served on one H100 (issue 52's runs): the envelope has it
    assert any(d.model.startswith("codellama") and d.tp == 1 and d.hardware.name == "H100" for d in env.deployments)


def test_the_floor_is_the_roofline_of_the_work_plus_the_all_reduce():
    env = envelope_for()
    c = env.components
    flops = c[COMPONENT_INDEX["gemm_pf"]] + c[COMPONENT_INDEX["gemm_dc"]] + c[COMPONENT_INDEX["attn_pf"]]
    flops = flops + c[COMPONENT_INDEX["attn_dc"]]
    reads = c[COMPONENT_INDEX["weights"]] + c[COMPONENT_INDEX["kv_read"]] + c[COMPONENT_INDEX["kv_write"]]
    assert np.allclose(floor_of(c), np.maximum(flops, reads) + c[COMPONENT_INDEX["allreduce"]])
    # prefill chunks are compute-bound and small decode batches memory-bound: both sides bind somewhere
    assert (flops > reads).any() and (reads > flops).any()


def test_a_program_at_peak_is_on_the_floor_and_one_faster_than_peak_is_below_it():
    assert check_floor(parse_program(ROOFLINE_AT.format(k=1.0))).ok
    below = check_floor(parse_program(ROOFLINE_AT.format(k=0.9)))
    assert not below.ok and below.ratio == pytest.approx(0.9)
    assert "0.9x the physical floor" in below.reason() and " on " in below.worst and "TP" in below.worst


def test_every_physics_seed_is_above_the_floor_and_blackbox_is_below_it():
    for name in ("roofline", "trained_physics", "regime_switch", "phase_decomposed"):
        check = check_floor(load_program(seed_path(name)))
        assert check.ok and check.margin > 0.05, (name, check)
    blackbox = check_floor(load_program(baseline_path("blackbox")))
    assert not blackbox.ok and blackbox.ratio < 0.1


def test_a_program_without_prefill_compute_is_below_the_floor_on_an_uncached_prompt():
    # what #908 did: the step's reads and overheads, and no prefill FLOPs
    program = parse_program(
        '"""no prefill compute"""\nCONSTANTS = {"o": 2000.0}\n\n'
        "def step_time(f, c):\n    return c.o + 1.2 * (f.weights + f.kv_read + f.kv_write) + f.allreduce\n"
    )
    check = check_floor(program)
    assert not check.ok and "prefill" in check.worst


def test_a_step_time_that_is_not_finite_somewhere_in_the_envelope_is_below_the_floor():
    program = parse_program(
        '"""nan"""\n\ndef step_time(f, c):\n    return f.weights * exp(f.ctx_max) - 1e300 * exp(80)\n'
    )
    check = check_floor(program)
    assert not check.ok


def test_the_floor_needs_each_experiments_gpu():
    fake = type("Fake", (), {"name": "odd-experiment", "hardware": "TPUv9", "arch": None, "tp": 1})()
    with pytest.raises(FloorError, match="odd-experiment.*TPUv9"):
        envelope_for([fake])


def _fast_world_experiment() -> Experiment:
    """An experiment whose 'measurements' come from a server 40 % faster than the hardware's peak."""
    arch = catalog().models["meta-llama/Llama-3.1-8B"].arch
    rng = np.random.default_rng(1)
    n = 60
    exp = Experiment.from_arrays(
        "too-fast",
        np.cumsum(rng.exponential(40_000, n)).astype(np.int64),
        rng.integers(200, 1500, n),
        rng.integers(20, 200, n),
        arch=arch,
        split=(0.98, 0.01),
    )
    truth = parse_program(ROOFLINE_AT.format(k=0.6))
    res = replay(exp, compile_program(truth), np.array([0.6]))
    assert res.ok
    return dataclasses.replace(exp, e2e_s=res.e2e_us / 1e6, ttft_s=res.ttft_us / 1e6)


def test_a_fit_never_takes_constants_below_the_floor_even_where_the_data_want_them():
    exp = _fast_world_experiment()
    program = parse_program(SCALED)
    with ReplayPool([exp]) as pool:
        free = fit_constants(program, [exp], pool, FitConfig(seed=0, floor=False, max_evals=20))
        held = fit_constants(program, [exp], pool, FitConfig(seed=0, max_evals=20))
    assert free.constants["all"]["k"] < 0.8  # the data's optimum is faster than peak
    assert held.constants["all"]["k"] >= 0.99
    assert check_floor(program, held.constants["all"]).ok
    assert not check_floor(program, free.constants["all"]).ok


def test_fit_refuses_a_program_below_the_floor_in_one_line_and_fits_it_with_physics_off(tmp_path):
    runner = CliRunner()
    out = tmp_path / "bb.py"
    res = runner.invoke(app, ["fit", str(baseline_path("blackbox")), "--out", str(out), "--max-evals", "2"])
    only_error_line(res, "blackbox.py", "physical floor", "[floor]", "--physics off")
    assert not out.exists()
    res = runner.invoke(
        app,
        [
            "fit",
            str(baseline_path("blackbox")),
            "--out",
            str(out),
            "--max-evals",
            "2",
            "--physics",
            "off",
            "--no-profile",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "floor: BELOW" in res.stdout and out.exists()


def test_eval_reports_the_floor_margin_and_fit_the_fitted_programs(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["eval", str(seed_path("roofline")), "--json"])
    assert res.exit_code == 0, res.output
    import json

    report = json.loads(res.stdout)
    assert report["floor"]["ok"] and report["floor"]["ratio"] > 1 and report["physics"] == []
    res = runner.invoke(app, ["eval", str(baseline_path("blackbox"))])
    assert res.exit_code == 0 and "floor: BELOW" in res.stdout
    res = runner.invoke(
        app, ["fit", str(seed_path("roofline")), "--out", str(tmp_path / "r.py"), "--max-evals", "3", "--json"]
    )
    fitted = json.loads(res.stdout)
    assert fitted["floor"]["all"]["ok"] and fitted["physics"] == "check"
