"""The physics' back doors (issue 63, item 1), each closed wherever a program enters: the rules
(evaluator/physics), `evolve eval` (reported), `fit` and `emit-go` (refused, one line, nothing
written), `run` as a seed and as a child (the LLM's, in both engines), and the replay and the Go
model, which fail at a step below its floor rather than clamp it."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import LEAN
from llm_server import ScriptedLLM
from typer.testing import CliRunner

from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.dsl import compile_program, load_program, parse_program
from stepml_evolve.evaluator.physics.floor import Reach, check_floor, envelope_for
from stepml_evolve.evaluator.physics.rules import held_bounds, inherit, physics_problems
from stepml_evolve.evaluator.replay.closed_loop import replay
from stepml_evolve.evaluator.replay.state import BELOW_FLOOR, OK
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import baseline_path, seed_path

ROOFLINE = seed_path("roofline").read_text()
RETURN = "    return c.overhead_us + max(c.c_compute * compute, c.c_memory * memory) + f.allreduce\n"
ALL = "f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc"
BODY = "(c.overhead_us + max(c.c_compute * compute, c.c_memory * memory) + f.allreduce)"


def door(step: str, constants: str = "", compute: str | None = None) -> str:
    """The roofline seed with step_time returning `step` (BODY is its own), more constants, and
    another compute sum."""
    text = ROOFLINE.replace(RETURN, f"    return {step}\n")
    text = text.replace("CONSTANTS = {\n", "CONSTANTS = {\n" + constants, 1)
    if compute:
        text = text.replace(
            "    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc\n", f"    compute = {compute}\n"
        )
    assert text != ROOFLINE
    return text


NEGATIVE = '    "neg": {"start": -1.0, "min": -10.0, "max": -0.5, "prior": -1.0, "spread": 0.5},\n'
TWO = '    "a": {"start": 2.0, "min": 0.0, "max": 10.0},\n    "b": {"start": 1.0, "min": 0.0, "max": 10.0},\n'
# name -> (program text, the rule that refuses it, words of its message)
DOORS = {
    # the step gets faster as prefill grows: the subtraction rule only flipped on negative literals
    "negative_constant": (door(f"{BODY} * 3 + c.neg * f.gemm_pf", NEGATIVE), "sign", "c.neg may be negative"),
    # a > b at the start, so the floor saw nothing; the fit may take b past a
    "difference_of_constants": (door(f"{BODY} + (c.a - c.b) * f.gemm_pf", TWO), "sign", "a difference of constants"),
    # negative steps past the envelope, silently clamped to 1 us in the Go
    "negative_branch": (door(f"{BODY} * (1.0 if f.tok_pf < 20000 else -1.0)"), "sign", "-1.0"),
    "tiny_branch_past_the_envelope": (
        door(f"{BODY} * (1.0 if f.tok_pf < 20000 else 0.000001)"),
        "threshold",
        "f.tok_pf < 20000",
    ),
    "threshold_past_the_longest_context": (
        door(f"{BODY} * (1.0 if f.ctx_max < 40000 else 0.000001)"),
        "threshold",
        "f.ctx_max spans 0 to 32,000",
    ),
    # a decode-only step's roofline (as a CUDA graph's), the same as the whole one on every envelope
    # step it takes; a step that holds a prefill too, sent to it, runs that prefill for free
    "branch_without_prefill_compute": (
        door(
            "c.overhead_us + max(c.c_compute * (f.gemm_dc + f.attn_dc), c.c_memory * memory) + f.allreduce"
            f" if f.tok_pf < 1 else {BODY}"
        ),
        "floor",
        "a branch of step_time",
    ),
    # the crossover child a world's `best` deployed: decode GEMM and both attentions summed twice
    "component_counted_twice": (
        door(RETURN.strip()[len("return ") :], compute="f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc + f.gemm_dc"),
        "twice",
        "counts f.gemm_dc twice in one sum",
    ),
    # a V: abs of a time minus a constant falls before it rises
    "absolute_value_of_a_difference": (
        door(f"{BODY} + c.k * abs(f.gemm_pf - c.j)", '    "k": 1.5,\n    "j": 20000.0,\n'),
        "sign",
        "abs(f.gemm_pf - c.j)",
    ),
}


@pytest.fixture(scope="module")
def door_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("doors")
    for name, (text, _, _) in DOORS.items():
        (d / f"{name}.py").write_text(text)
    return d


@pytest.mark.parametrize("name", list(DOORS))
def test_each_back_door_is_refused_by_its_rule(name):
    text, rule, words = DOORS[name]
    problems = physics_problems(parse_program(text))
    assert problems, f"{name} passes --physics check"
    assert problems[0][0] == rule and words in problems[0][1], problems[0]


def test_the_shipped_seeds_and_the_sound_form_of_each_door_pass():
    for name in ("roofline", "trained_physics", "regime_switch", "phase_decomposed"):
        assert physics_problems(load_program(seed_path(name))) == [], name
    hinge = door(f"{BODY} + c.k * max(0, f.ctx_max - 2048)", '    "k": 0.05,\n')
    inside = door(f"{BODY} * (1.0 if f.tok_pf < 4000 else 1.5)")
    assert physics_problems(parse_program(hinge)) == [] and physics_problems(parse_program(inside)) == []
    # a tile's padding per token on the compute side is a time of its own, not the GEMM summed again;
    # the GEMM over a constant is the GEMM again
    padded, again = (
        door(RETURN.strip()[len("return ") :], '    "k": 96.0,\n', compute=f"{ALL} + c.k * {per}")
        for per in ("(f.gemm_pf + f.gemm_dc) / f.tokens", "(f.gemm_pf + f.gemm_dc) / c.k")
    )
    assert physics_problems(parse_program(padded)) == []
    assert physics_problems(parse_program(again))[0][0] == "twice"


def test_a_constant_with_no_min_is_held_at_zero_or_above_and_a_new_threshold_gets_bounds_inside_the_envelope():
    prog = parse_program(door(f"{BODY} + c.k * f.n_req", '    "k": 5.0,\n'))
    assert "k" not in prog.bounds and held_bounds(prog)["k"] == (0.0, float("inf"))
    child = parse_program(door(f"{BODY} * (1.5 if f.n_dc > c.t else 1.0)", '    "t": 40.0,\n'))
    assert physics_problems(child)[0][0] == "threshold"  # no bounds: a fit could move it past every step
    env = envelope_for()
    held = inherit(child, load_program(seed_path("roofline")), env)
    lo, hi = held.bounds["t"]
    assert 0 < lo < hi < 512 and physics_problems(held, env) == []


def test_the_envelope_reaches_as_far_as_the_data(synthetic):
    exps = synthetic.experiments
    assert envelope_for(exps).steps == envelope_for().steps  # the sample lies inside the envelope
    far = Reach().covering(65_536, 1024, 131_072)
    env = envelope_for()
    from stepml_evolve.evaluator.physics.floor import build_envelope

    wide = build_envelope(env.deployments, far)
    labels = {s.label for s in wide.steps}
    assert "prefill 65,536 tokens" in labels and any("decode 1024 on" in x for x in labels)
    assert any("131,071-token" in x for x in labels) and len(wide) > len(env)


def test_the_replay_fails_at_a_step_below_its_floor_naming_it_and_only_when_asked(synthetic):
    blackbox = load_program(baseline_path("blackbox"))  # below the floor on large prefills
    compiled, consts = compile_program(blackbox), np.array(list(blackbox.constants.values()))
    exp = synthetic.experiments[0]
    res = replay(exp, compiled, consts, floor=True)
    assert res.status == BELOW_FLOOR
    why = res.failure()
    assert f"at step {res.n_steps} (prefill " in why and "x its physical floor of " in why and "\n" not in why
    assert replay(exp, compiled, consts).status == OK  # --physics off: a regression runs as it is
    roofline = load_program(seed_path("roofline"))
    assert replay(exp, compile_program(roofline), np.array(list(roofline.constants.values())), floor=True).ok
    with ReplayPool(synthetic.experiments[:1], workers=1, floor=True) as pool:
        row = pool.score(blackbox, [consts])["test"][0]
    assert "physical floor" in (row.error or "")


def test_a_negative_delay_fails_the_replay_rather_than_be_clamped_to_zero(synthetic):
    prog = parse_program(
        'CONSTANTS = {"q": 10.0}\ndef step_time(f, c):\n    return 1000.0 + 2 * f.weights\n'
        "def queueing_time(r, c):\n    return c.q - r.input_tokens\n"
    )
    res = replay(synthetic.experiments[0], compile_program(prog), np.array([10.0]))
    assert not res.ok and "queueing_time returned" in res.failure() and "at least 0" in res.failure()


def test_eval_reports_each_door_and_fit_and_emit_go_refuse_it_in_one_line(door_files, tmp_path):
    runner = CliRunner()
    for name, (_, rule, words) in DOORS.items():
        path = door_files / f"{name}.py"
        res = runner.invoke(app, ["fit", str(path), "--out", str(tmp_path / "f.py"), "--max-evals", "2"])
        assert res.exit_code == 2 and f"[{rule}]" in res.output and words in res.output, (name, res.output)
        errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and f"[{rule}]" in errors[0] and not (tmp_path / "f.py").exists()
        res = runner.invoke(app, ["emit-go", str(path), "--out", str(tmp_path / "m.go")])
        assert res.exit_code == 2 and f"[{rule}]" in res.output and not (tmp_path / "m.go").exists(), res.output
    for name in ("negative_constant", "branch_without_prefill_compute", "component_counted_twice"):
        _, rule, words = DOORS[name]
        res = runner.invoke(app, ["eval", str(door_files / f"{name}.py")])
        said = f"--physics check refuses it [{rule}]" if rule != "floor" else "floor: BELOW: "  # the floor's own line
        assert res.exit_code == 0 and said in res.output and words in res.output, res.output


SMALL = ["--seed-program-fit-evals", "8", "--full-fit-evals", "8", "--quick-evals", "6", "--front-cv", "none"]
SMALL += LEAN


def test_a_run_refuses_each_door_as_a_seed(door_files, tmp_path):
    res = CliRunner().invoke(
        app,
        ["run", "--generations", "1", "--seed", "3", "--archive", str(tmp_path / "a"), "--children", "2"]
        + ["--seed-programs", str(door_files), "--seed-programs", str(seed_path("roofline")), *SMALL],
    )
    assert res.exit_code == 0, res.output
    for name, (_, rule, _) in DOORS.items():
        assert f"seed program {name}: rejected by --physics check ({rule})" in res.output, name
    archive = Archive(tmp_path / "a", read_only=True)
    try:
        run = archive.run()
        assert [p.operator for p in archive.programs(run.id) if p.generation == 0] == ["seed"]  # the roofline alone
        assert Counter(r.rule for r in archive.rejections(run.id) if r.operator == "seed") == Counter(
            rule for _, rule, _ in DOORS.values()
        )
    finally:
        archive.close()


def _reply(n: int) -> str:
    return "A faster program:\n```python\n" + list(DOORS.values())[n % len(DOORS)][0] + "```\n"


@pytest.mark.parametrize("engine", ["mapelites", "openevolve"])
def test_a_run_refuses_each_door_as_an_llms_child_in_both_engines(tmp_path, engine):
    extra = ["--llm-ratio", "1.0", "--children", "4"] if engine == "mapelites" else ["--rewrites", "--residual", "0"]
    with ScriptedLLM([], default=_reply) as server:
        res = CliRunner().invoke(
            app,
            ["run", "--engine", engine, "--generations", "2" if engine == "mapelites" else "8", "--seed", "3"]
            + ["--archive", str(tmp_path / "a"), "--seed-programs", str(seed_path("roofline")), *SMALL, *extra]
            + ["--llm", "openai/test-model", "--llm-base-url", server.base_url, "--llm-timeout", "30"],
        )
    assert res.exit_code == 0, res.output
    archive = Archive(tmp_path / "a", read_only=True)
    try:
        run = archive.run()
        sources = [p.source for p in archive.programs(run.id)]
        texts = [text for text, _, _ in DOORS.values()]
        assert not any(any(t.strip() in s for t in texts) for s in sources)  # no door entered the archive
        # mapelites: the LLM operator's own check (rules llm-*, each reason fed back to the LLM);
        # openevolve: our judge's
        rules = {r.rule.removeprefix("llm-") for r in archive.rejections(run.id)}
        assert rules == {rule for _, rule, _ in DOORS.values()}, rules
    finally:
        archive.close()


def test_a_fitted_program_stays_above_the_floor_on_each_branch(synthetic):
    from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants

    prog = parse_program(
        door(f"{BODY} * (c.light if f.tok_pf < 512 else 1.0)", '    "light": {"start": 1.5, "min": 0.0},\n')
    )
    assert physics_problems(prog, envelope_for(synthetic.experiments)) == []
    with ReplayPool(synthetic.experiments, floor=True) as pool:
        res = fit_constants(prog, synthetic.experiments, pool, FitConfig(seed=1, max_evals=10))
    check = check_floor(prog, res.constants["all"], envelope_for(synthetic.experiments))
    assert check.ok, check.reason()
