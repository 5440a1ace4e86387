"""Discovery (issue 64): per-request residuals on a program's own schedule, where the error grows,
the typed library of candidate terms, screening in closed form with its chance and held-out
checks, and the `residual_term` operator in a run. Planted laws: worlds whose law is the roofline
plus one known term, generated for the test; the parent is the law without that term, at the law's
constants, so the screening alone must name the term."""

from __future__ import annotations

import ast
import json

import numpy as np
import pytest
from conftest import archived_children, tiny_run
from typer.testing import CliRunner

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.discovery.explain import explain
from stepml_evolve.evaluator.discovery.residuals import ResidualsError, residuals_of
from stepml_evolve.evaluator.discovery.screening import MIN_GAIN, screen, screen_program
from stepml_evolve.evaluator.discovery.sites import sites_of
from stepml_evolve.evaluator.discovery.terms import library, placed, step_values
from stepml_evolve.evaluator.dsl import check_units, load_program, parse_program
from stepml_evolve.evaluator.dsl.numexpr_compile import compile_vector, evaluate_vector
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX
from stepml_evolve.evaluator.known_truth.generate import write_world
from stepml_evolve.evaluator.known_truth.laws import World
from stepml_evolve.evaluator.physics.rules import physics_problems
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.search.residual_terms import with_terms
from stepml_evolve.seeds import seed_path

BASE_LAW = '''"""{doc}"""
CONSTANTS = {{
    "base_us": {{"start": 1500.0, "min": 0.0}},
    "c_compute": {{"start": 1.6, "min": 1.0, "max": 100.0}},
    "c_memory": {{"start": 1.3, "min": 1.0, "max": 100.0}},{extra}
    "queue_us": {{"start": 1800.0, "min": 0.0, "max": 15000.0}},
    "lag_steps": {{"start": 1.3, "min": 0.0, "max": 4.0}},
    "out_tok_us": {{"start": 45.0, "min": 0.0, "max": 6000.0}},
}}


def step_time(f, c):
    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc
    memory = f.weights + f.kv_read + f.kv_write
    return c.base_us + max(c.c_compute * compute{inside}, c.c_memory * memory) + f.allreduce{term}


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us{queued}


def output_token_time(c):
    return c.out_tok_us
'''
# name -> (the planted term, its constant, how the screening writes the true term, its knot)
PLANTED = {
    "hinge": (
        " + c.k_p * max(0, f.ctx_max - 1500)",
        '"k_p": {"start": 2.0, "min": 0.0},',
        "k * max(0, f.ctx_max - ",
        1500,
    ),
    "log_blocks": (
        " + c.k_p * log(1 + f.ctx_sum / 16)",
        '"k_p": {"start": 300.0, "min": 0.0},',
        "k * log(1 + f.ctx_sum / 16)",
        None,
    ),
    "tile_padding": (
        " + c.k_p * (f.gemm_pf + f.gemm_dc) / f.tokens",
        '"k_p": {"start": 200.0, "min": 0.0},',
        "k * (f.gemm_pf + f.gemm_dc) / f.tokens",
        None,
    ),
}
# a latency per hop of each layer's all-reduces, over a tree of log2(tp) hops (the planted k_p: us per
# layer and natural-log hop)
COLLECTIVE = (
    " + c.k_p * f.layers * log(f.tp)",
    '"k_p": {"start": 40.0, "min": 0.0},',
    "k * f.layers * log(f.tp)",
    None,
)


# the API server's work on a prompt before the engine schedules it (tokenizing, hashing its blocks):
# planted in queueing_time, us per prompt token
PROMPT = (
    " + c.k_p * r.input_tokens",
    '"k_p": {"start": 8.0, "min": 0.0},',
    "k * r.input_tokens",
    None,
)


# a GEMM tile's padding on the compute side of the roofline, where the weights' streaming hides it
# on memory-bound steps (worlds/tile_quantization.py)
TILE_INSIDE = (
    " + c.k_p * (f.gemm_pf + f.gemm_dc) / f.tokens",
    '"k_p": {"start": 200.0, "min": 0.0},',
    "k * (f.gemm_pf + f.gemm_dc) / f.tokens inside max(.., c.c_compute * compute, ..)",
    None,
)


def law(term: str = "", extra: str = "", doc: str = "A planted law.", queued: str = "", inside: str = "") -> str:
    return BASE_LAW.format(doc=doc, extra=f"\n    {extra}" if extra else "", term=term, queued=queued, inside=inside)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """Each planted world (and one without any term) generated at the medium size, with its parent:
    the law without its term, at the law's constants."""
    out = {}
    planted = {
        **PLANTED,
        "collective": COLLECTIVE,
        "prompt": PROMPT,
        "tile_inside": TILE_INSIDE,
        "none": ("", "", "", None),
    }
    for name, (term, extra, _, _) in planted.items():
        where = {"prompt": "queued", "tile_inside": "inside"}.get(name, "term")
        placed = {"term": "", "queued": "", "inside": "", where: term}
        program = parse_program(law(extra=extra, doc=f"Planted {name}.", **placed))
        d = tmp_path_factory.mktemp(name)
        write_world(World(name, program), d / "data", seed=1, size="medium")
        parent = parse_program(law())
        out[name] = (load_data(d / "data"), parent, {k: v for k, v in program.constants.items() if k != "k_p"})
    return out


def _residuals(data, parent, constants, keep=lambda e: True):
    with ReplayPool([e for e in data.experiments if keep(e)], workers=2) as pool:
        return residuals_of(parent, constants, pool)


def _screened(rs):
    """The library of the residuals' own steps screened on them."""
    return screen(rs, library(step_values([r.components for r in rs])))


def test_a_request_s_sums_are_linear_and_hold_its_own_steps(synthetic):
    roofline = load_program(seed_path("roofline"))
    rs = _residuals(synthetic, roofline, roofline.constants)
    vf = compile_vector(roofline, "step_time")
    for r in rs:
        inputs = {f"f_{n}": r.components[i] for n, i in COMPONENT_INDEX.items()}
        inputs.update({f"c_{k}": v for k, v in roofline.constants.items()})
        dt = np.round(evaluate_vector(vf, inputs))
        own = r.sums(dt)[:, :, 0] * r.scale[:, None]
        # the TTFT is its delays (queueing, the output token's) plus the steps it lived through; idle
        # gaps the engine waited for an arrival are not steps: never more than the prediction
        assert (r.predicted[1] - own[1] >= roofline.constants["queue_us"] + roofline.constants["out_tok_us"] - 1).all()
        g1, g2 = r.column("n_req"), r.column("kv_read")
        both = r.sums(np.stack([3.0 * g1 + g2, g1], axis=1))
        assert np.allclose(both[:, :, 0], 3.0 * both[:, :, 1] + r.sums(g2)[:, :, 0])
        assert (r.sums(np.ones(r.n_steps))[1] > 0).all()  # every measured request lived through a step


@pytest.mark.parametrize("name", list(PLANTED))
def test_screening_alone_names_the_planted_term_first(worlds, name):
    data, parent, constants = worlds[name]
    rs = _residuals(data, parent, constants)
    s = _screened(rs)
    _, _, written, knot = PLANTED[name]
    best = s.passed[0]
    assert best.term.shown().startswith(written), [p.term.shown() for p in s.passed[:5]]
    if knot is not None:
        assert abs(best.term.knot - knot) <= 0.1 * knot, best.term.knot
    assert best.gain > 0.2 and all(v > 0 for v in best.held_out.values()) and best.gain > best.chance
    assert s.false_passes < 0.2  # with the first shuffle taken for the residuals, few pass by chance


def test_screening_names_a_collective_latency_and_its_size_where_the_tp_degrees_tell_the_forms_apart(worlds):
    """tp 1, 2 and 4 (the medium grid) tell a tree of log2(tp) hops from a ring of tp - 1 only through
    the two tp-4 deployments, and the closed loop bends the residuals there: the screening must name a
    per-layer collective term first and pass the planted one at its size, not tell the two apart."""
    data, parent, constants = worlds["collective"]
    rs = _residuals(data, parent, constants)
    s = _screened(rs)
    best = s.passed[0]
    assert best.term.family == "collective" and "f.layers" in best.term.body, [p.term.shown() for p in s.passed[:5]]
    planted = next(p for p in s.passed if p.term.shown() == COLLECTIVE[2])
    assert abs(planted.coefficient - 40.0) <= 0.25 * 40.0, planted.coefficient
    assert all(v > 0 for v in planted.held_out.values()) and planted.gain > planted.chance
    others = [p for p in s.passed if p.term.family != "collective"]
    assert all(o.gain < planted.gain for o in others)  # a per-layer collective beats every proxy


def test_a_term_one_model_alone_exercises_is_judged_by_its_workloads_and_one_nothing_can_judge_never_passes(worlds):
    """As in a by-gpu split's train configurations, the 70B is the only model at TP > 1. Leaving it out
    cannot judge a collective term (the model grouping sees it on one side only), so its held-out
    test rests on the 70B's three workloads, and the planted term passes at its size. With one 70B
    experiment left, no grouping can judge it: it does not pass, however much it gains. On the law
    with no such term, no term passes judged by one grouping alone."""
    data, parent, constants = worlds["collective"]
    seventy = "meta-llama/Llama-2-70b-hf"
    rs = _residuals(data, parent, constants, lambda e: e.tp == 1 or e.model == seventy)
    s = _screened(rs)
    planted = next(p for p in s.passed if p.term.shown() == COLLECTIVE[2])
    assert set(planted.held_out) == {"workload"} and planted.held_out["workload"] > 0
    assert abs(planted.coefficient - 40.0) <= 0.25 * 40.0, planted.coefficient
    assert s.passed[0].term.family == "collective", [p.term.shown() for p in s.passed[:5]]

    rs = _residuals(data, parent, constants, lambda e: e.tp == 1 or (e.model == seventy and e.workload == "mixed"))
    s = _screened(rs)
    lone = next(r for r in s.results if r.term.shown() == COLLECTIVE[2])
    assert lone.held_out == {} and not lone.passed and lone.gain > MIN_GAIN, (lone.gain, lone.chance)
    assert not any(r.passed for r in s.results if r.term.family == "collective")

    data, parent, constants = worlds["none"]  # the law with no such term: nothing passes on one grouping's word
    rs = _residuals(data, parent, constants, lambda e: e.tp == 1 or e.model == seventy)
    s = _screened(rs)
    assert [p.term.shown() for p in s.passed if len(p.held_out) < 2] == [] and s.false_passes == 0.0


def test_a_tethered_screening_weighs_each_term_at_most_at_the_size_the_tether_allows(worlds):
    """With the parent as its own seed: every coefficient at most its cap, a capped term's gain what
    it removes at the cap, and the child of the best one fitted within it and inside the tether at
    its start."""
    from stepml_evolve.evaluator.discovery.screening import tethered_to
    from stepml_evolve.evaluator.physics.floor import envelope_for
    from stepml_evolve.evaluator.physics.tether import TETHER_FACTOR, envelope_steps, stray

    data, parent, constants = worlds["collective"]
    rs = _residuals(data, parent, constants)
    terms = library(step_values([r.components for r in rs]))
    free, tied = screen(rs, terms, refine=False), screen(rs, terms, refine=False, tether=tethered_to(parent, constants))
    assert tied.capped > 0 and free.capped == 0
    by_term = {r.term: r for r in free.results}
    for r in tied.results:
        assert 0 <= r.coefficient <= r.cap
        if by_term[r.term].coefficient > r.cap:  # bounded: at the cap, and it removes less there
            assert r.coefficient == r.cap and r.gain < by_term[r.term].gain
        else:
            assert r.coefficient == pytest.approx(by_term[r.term].coefficient) and r.gain == pytest.approx(
                by_term[r.term].gain
            )
    best = tied.passed[0]
    values = step_values([r.components for r in rs])
    child = parse_program(with_terms(parent, constants, [best], values, "child"))
    new = (set(child.constants) - set(parent.constants)).pop()
    assert child.bounds[new] == (0.0, best.cap) and child.constants[new] == best.coefficient
    env = envelope_for()
    assert (
        stray(envelope_steps(child, child.constants, env), envelope_steps(parent, constants, env))
        <= TETHER_FACTOR + 1e-6
    )
    # each of two collective terms at its cap keeps the child within the tether, both together do not
    tether = tethered_to(parent, constants)
    a, b = [r for r in tied.results if r.term.family == "collective" and "f.layers" in r.term.body][:2]
    assert tether.holds([a.term], [a.cap]) and tether.holds([b.term], [b.cap])
    assert not tether.holds([a.term, b.term], [a.cap, b.cap])


def test_a_prompt_cost_before_scheduling_is_named_and_its_child_pays_it_in_queueing_time(worlds):
    """A queueing term moves its request's TTFT and E2E by itself, whatever the steps: the screening
    names the planted per-prompt-token cost first at its size, and the child adds it to
    queueing_time (making one where the parent has none), a valid time under the physics checks."""
    data, parent, constants = worlds["prompt"]
    rs = _residuals(data, parent, constants)
    s = _screened(rs)
    best = s.passed[0]
    assert best.term.shown() == PROMPT[2], [p.term.shown() for p in s.passed[:5]]
    # the frozen schedule misses the step boundary a later request waits for: k a little over the law's
    assert abs(best.coefficient - 8.0) <= 0.25 * 8.0, best.coefficient
    assert best.gain > 0.15 and all(v > 0 for v in best.held_out.values()) and best.gain > best.chance, best
    values = step_values([r.components for r in rs])
    for program in (parent, parse_program(law().split("\n\n\ndef queueing_time")[0] + "\n")):
        child = parse_program(with_terms(program, dict(program.constants), [best], values, "c"))
        check_units(child)
        assert physics_problems(child) == [], physics_problems(child)[:1]
        assert "r.input_tokens" in ast.unparse(child.functions["queueing_time"])
        assert "r.input_tokens" not in ast.unparse(child.functions["step_time"])
    none = _screened(_residuals(*worlds["none"]))
    assert not any(p.term.family == "request" for p in none.passed)


def test_a_term_the_parent_s_constants_absorbed_is_named_once_they_are_refitted_beside_it(worlds):
    """The parent's fit moves what it can of a missing mechanism into its own constants: here its
    queueing constant holds the planted prompt cost at the mean prompt. At those constants the
    prompt term shows only what is left over; with the parent's constants refitted beside each term
    (refit.py, as `evolve explain --refit` screens) it is named first again, at its size. On the law with no
    such term, refitting the constants lets nothing pass that removes 1 % of the residual."""
    data, parent, constants = worlds["prompt"]
    mean_prompt = float(np.mean(np.concatenate([e.input_tokens for e in data.experiments])))
    absorbed = {**constants, "queue_us": constants["queue_us"] + 8.0 * mean_prompt}
    rs = _residuals(data, parent, absorbed)
    plain = next(s for s in _screened(rs).results if s.term.family == "request")
    refitted = screen_program(parent, absorbed, rs, refit=True)
    best = refitted.passed[0]
    assert best.term.shown() == PROMPT[2], [p.term.shown() for p in refitted.passed[:5]]
    assert abs(best.coefficient - 8.0) <= 0.25 * 8.0 and best.gain > 2 * max(plain.gain, 0.01), (best, plain)
    assert all(v > 0 for v in best.held_out.values()) and best.gain > best.chance + MIN_GAIN
    data, parent, constants = worlds["none"]
    none = screen_program(parent, constants, _residuals(data, parent, constants), refit=True)
    assert all(p.gain < 0.01 for p in none.passed) and none.false_passes == 0.0, none.passed[:2]


def test_a_tile_s_padding_is_named_inside_the_roofline_s_compute_side_and_its_child_puts_it_there(worlds):
    """Planted inside the compute side of the roofline, a tile's padding is named there first (not
    outside the max, where it would cost the memory-bound steps too); the child adds it to that side
    and is the law itself at the planted size, a valid time under the physics checks. Planted outside
    the max, the same term is named outside first."""
    data, parent, constants = worlds["tile_inside"]
    rs = _residuals(data, parent, constants)
    s = screen_program(parent, constants, rs)
    best = s.passed[0]
    assert best.term.shown() == TILE_INSIDE[2], [p.term.shown() for p in s.passed[:5]]
    outside = next(r for r in s.results if r.term.shown() == PLANTED["tile_padding"][2])
    assert best.gain > outside.gain + MIN_GAIN and all(v > 0 for v in best.held_out.values()), (best, outside)
    # linearized at the parent's binding sides: the decode steps the padding makes compute-bound add
    # less than k * g and are not in its column, so k comes out over the law's (the child's fit moves it)
    assert 200.0 <= best.coefficient <= 2 * 200.0, best.coefficient
    values = step_values([r.components for r in rs])
    child = parse_program(with_terms(parent, constants, [best], values, "child"))
    check_units(child)
    assert physics_problems(child) == [], physics_problems(child)[:1]
    truth = parse_program(law(extra=TILE_INSIDE[1], inside=TILE_INSIDE[0]))
    new = (set(child.constants) - set(parent.constants)).pop()
    env = {f"f_{n}": rs[0].components[i] for n, i in COMPONENT_INDEX.items()}
    at = {**{f"c_{k}": v for k, v in child.constants.items()}, f"c_{new}": 200.0}
    law_at = {f"c_{k}": v for k, v in truth.constants.items()}
    assert np.allclose(
        evaluate_vector(compile_vector(child, "step_time"), {**env, **at}),
        evaluate_vector(compile_vector(truth, "step_time"), {**env, **law_at}),
    )
    data, parent, constants = worlds["tile_padding"]
    s = screen_program(parent, constants, _residuals(data, parent, constants))
    assert s.passed[0].term.shown() == PLANTED["tile_padding"][2], [p.term.shown() for p in s.passed[:5]]


def test_residual_term_screens_beside_the_refitted_constants_where_nothing_passes_at_the_parent_s(worlds):
    """--residual-refit fallback (the default): a parent whose screening at its own constants passes a
    term keeps it; one where none passes is screened again beside its refitted constants; always and
    never do as they say, and the child's detail says which screening named its term."""
    from stepml_evolve.evolve.search.residual_terms import ResidualSource, next_child

    for name, refitted in (("hinge", False), ("none", True)):
        data, parent, constants = worlds[name]
        with ReplayPool(data.experiments, workers=2) as pool:
            screened = {
                mode: ResidualSource(pool, data.experiments, mode).screening(1, parent, constants)
                for mode in ("never", "fallback", "always")
            }
            if name == "hinge":
                child = next_child(ResidualSource(pool, data.experiments, "always"), 1, parent, constants, set())
        assert not screened["never"].refitted and screened["always"].refitted
        assert screened["fallback"].refitted == refitted and bool(screened["never"].passed) != refitted
    assert "screened beside refitted constants:" in child[1]


def test_on_a_law_with_no_such_term_nothing_passes(worlds):
    data, parent, constants = worlds["none"]
    rs = _residuals(data, parent, constants)
    s = _screened(rs)
    assert s.passed == [] and s.false_passes == 0.0 and len(s.results) > 400


def test_explain_says_where_a_missing_hinge_is(worlds):
    data, parent, constants = worlds["hinge"]
    found = explain(_residuals(data, parent, constants))
    top = found[0]
    assert (top.latency, top.feature) == ("E2E", "context (tokens)") and top.strength < -0.3, top.line()
    assert top.bins[-1][1] < top.bins[0][1] - 5  # the program is more than 5 points faster on the longest contexts


def test_every_library_term_added_to_a_seed_is_a_valid_time(synthetic):
    roofline = load_program(seed_path("roofline"))
    rs = _residuals(synthetic, roofline, roofline.constants)
    values = step_values([r.components for r in rs])
    terms = library(values)
    assert len(terms) > 300 and {t.family for t in terms} == {
        "overhead",
        "efficiency",
        "share",
        "log",
        "hinge",
        "switch",
        "collective",
        "request",
    }
    from stepml_evolve.evaluator.discovery.screening import Screened

    trained = load_program(seed_path("trained_physics"))  # sums no time at its top level but the all-reduce
    for t in terms:
        if "allreduce" in t.times:
            continue
        child = parse_program(with_terms(trained, dict(trained.constants), [Screened(t, 1.0, 0.1)], values, "c"))
        check_units(child)
        assert physics_problems(child) == [], (t.shown(), physics_problems(child)[:1])
    for name in ("trained_physics", "regime_switch"):  # inside each side of each roofline
        seed = load_program(seed_path(name))
        inside = placed(terms, sites_of(seed))
        assert len(inside) >= 5 and {t.family for t in inside} == {"share"}
        for t in inside:
            child = parse_program(with_terms(seed, dict(seed.constants), [Screened(t, 1.0, 0.1)], values, "c"))
            check_units(child)
            assert physics_problems(child) == [], (t.shown(), physics_problems(child)[:1])
            maxes = [
                n for n in ast.walk(child.functions["step_time"]) if isinstance(n, ast.Call) and n.func.id == "max"
            ]
            assert any("c.k1" in ast.unparse(a) for m in maxes for a in m.args), t.shown()  # inside a side


def test_evolve_explain_prints_where_and_what_and_refuses_a_program_it_cannot_replay(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["explain", str(seed_path("roofline")), "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    found = json.loads(res.output[res.output.index("{") :])
    assert found["requests"] > 500 and len(found["associations"]) >= 6
    assert found["screening"]["candidates"] > 300 and len(found["screening"]["terms"]) == 3
    for t in found["screening"]["terms"]:  # every coefficient within the tether's cap (a term adds time somewhere)
        assert t["cap"] is not None and 0 <= t["coefficient"] <= t["cap"]
    assert "bounded_by_tether" in found["screening"]
    res = runner.invoke(app, ["explain", str(seed_path("roofline")), "--top", "400", "--refit", "--json"])
    refitted = json.loads(res.output[res.output.index("{") :])["screening"]
    # beside the refitted constants the same library is judged otherwise: the gains differ
    assert res.exit_code == 0 and refitted["candidates"] == found["screening"]["candidates"]
    plain = {t["term"]: t["gain"] for t in found["screening"]["terms"]}
    assert any(abs(t["gain"] - plain[t["term"]]) > 1e-6 for t in refitted["terms"] if t["term"] in plain)
    res = runner.invoke(app, ["explain", str(seed_path("roofline"))])
    assert res.exit_code == 0 and "where the error grows" in res.output and "terms screened" in res.output
    assert "k max" in res.output and "bounded by the tether" in res.output
    bad = tmp_path / "negative.py"
    bad.write_text('CONSTANTS = {"a": 5.0}\ndef step_time(f, c):\n    return 1.0 - c.a\n')
    res = runner.invoke(app, ["explain", str(bad)])
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "negative.py" in errors[0] and "step_time returned" in errors[0]


def test_residuals_need_experiments(synthetic):
    roofline = load_program(seed_path("roofline"))
    with ReplayPool(synthetic.experiments, workers=1) as pool, pytest.raises(ResidualsError, match="#9: no experiment"):
        residuals_of(roofline, roofline.constants, pool, experiments=[], origin="#9")


def test_a_run_with_residual_term_archives_its_children_and_resumes_to_the_same_archive(tmp_path):
    import sqlite3

    res = tiny_run(tmp_path / "once", 3, "--residual", "0.6", "--explain")
    assert res.exit_code == 0, res.output
    rows = archived_children(tmp_path / "once", "residual_term")
    assert rows, "no residual_term child reached the archive"
    for source, detail in rows:
        assert detail.startswith("residual_term: + ") and "(screened" in detail and "held out by model" in detail
        assert "(tether)" in detail  # its coefficient bounded so the child stays within its seed's tether
        assert physics_problems(parse_program(source)) == []
    assert tiny_run(tmp_path / "twice", 2, "--residual", "0.6").exit_code == 0
    assert tiny_run(tmp_path / "twice", 3, "--residual", "0.6", "--resume").exit_code == 0

    def programs(d):
        db = sqlite3.connect(d / "archive.sqlite")
        try:
            return db.execute("SELECT source, operator, operator_detail, val_loss FROM programs ORDER BY id").fetchall()
        finally:
            db.close()

    assert programs(tmp_path / "twice") == programs(tmp_path / "once")

    # the run's end explained its best and its deployed program, and the report shows them
    from stepml_evolve.archive.store import Archive
    from stepml_evolve.evolve.browse.html_report import render

    a = Archive(tmp_path / "once", read_only=True)
    try:
        from stepml_evolve.evolve.deploy.rules import DEFAULT_RULE, choose

        best_id = a.run().summary["best"]["id"]
        stored = {e.program_id: e for e in a.explanations()}
        assert best_id in stored and choose(a, DEFAULT_RULE).program.id in stored
        e = stored[best_id]
        assert e.requests > 500 and e.associations[0]["bins"] and "terms" in e.screening
        page = render(a)
    finally:
        a.close()
    assert "Where the error grows" in page and page.count("mean signed error of the requests") == len(stored)


def test_the_llm_is_shown_where_its_parent_s_error_grows(tmp_path):
    from llm_server import ScriptedLLM, program_reply

    with ScriptedLLM([], default=lambda n: program_reply()) as server:
        res = tiny_run(
            tmp_path / "a",
            1,
            "--llm",
            "openai/test-model",
            "--llm-base-url",
            server.base_url,
            "--llm-ratio",
            "1.0",
            "--llm-timeout",
            "30",
        )
        asked = [m["content"] for r in server.requests for m in r["messages"] if m["role"] == "user"]
    assert res.exit_code == 0, res.output
    assert asked and all("Where inside the experiments its error grows" in a for a in asked)
    assert any("error by " in a and ("rho" in a or "eta^2" in a) for a in asked)


def test_prefix_sums_are_numpy_s_cumsum_bit_for_bit():
    """The screening's prefix sums (a compiled loop) add each column in row order, as np.cumsum does."""
    from stepml_evolve.evaluator.discovery.residuals import prefix_sums

    rng = np.random.default_rng(3)
    for shape in ((1, 1), (7, 3), (2000, 130)):
        g = rng.lognormal(5.0, 2.0, size=shape)
        c = prefix_sums(g[:, ::-1])  # any layout in
        assert c.shape == (shape[0] + 1, shape[1]) and (c[0] == 0).all()
        assert np.array_equal(c[1:], np.cumsum(g[:, ::-1], axis=0))
