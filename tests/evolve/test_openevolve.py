"""`evolve run --engine openevolve`: OpenEvolve 0.4 runs for real (its controller, its worker
process, its diff parser) against the local OpenAI-compatible test server with scripted replies,
and every candidate it evaluates lands in our archive through our judge."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from conftest import LEAN, ROOT, needs_real_data
from llm_server import PROSE_REPLY, ScriptedLLM, program_reply
from typer.testing import CliRunner

from stepml_evolve.archive.store import Archive
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.openevolve.engine import HEADER, as_program_file, failure_rule, unwrap

ROOFLINE = str(ROOT / "seeds" / "roofline.py")
MEMORY_LINE = "    memory = f.weights + f.kv_read + f.kv_write\n"
# lines every program of these runs keeps, so a diff applies whichever parent OpenEvolve samples
QUEUE_LINE, LAST_DEF = "    return c.queue_us + c.lag_steps * r.last_step_us\n", "def output_token_time(c):\n"
SMALL = ["--seed-programs", ROOFLINE, "--seed-program-fit-evals", "20", "--full-fit-evals", "12", "--front-cv", "none"]
SMALL += ["--residual", "0"]  # every call goes to the scripted LLM (residual_term's own test sets it)
SMALL += LEAN


def diff(search: str, replace: str, note: str = "A change.") -> str:
    return f"{note}\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def _run(tmp_path: Path, server: ScriptedLLM, generations: int, *extra: str, archive: str = "arch", small=SMALL):
    return CliRunner().invoke(
        app,
        [
            "run",
            "--engine",
            "openevolve",
            "--generations",
            str(generations),
            "--seed",
            "5",
            "--archive",
            str(tmp_path / archive),
            "--llm",
            "openai/test-model",
            "--llm-base-url",
            server.base_url,
            *small,
            *extra,
            "--json",
        ],
    )


def test_every_reply_openevolve_makes_of_it_is_recorded_with_its_rule_and_nothing_is_executed(tmp_path):
    pwned = tmp_path / "pwned"
    script = [
        ("reply", diff(MEMORY_LINE, "    memory = f.weights + f.kv_read + 1.5 * f.kv_write\n")),  # valid
        ("reply", PROSE_REPLY),  # no diff at all
        ("reply", diff(QUEUE_LINE, "    return __import__('os').getpid()\n")),  # not the DSL
        ("reply", diff(LAST_DEF, f"open({str(pwned)!r}, 'w').write('x')\n\n" + LAST_DEF)),  # code to run
        ("reply", diff(HEADER.splitlines()[0] + "\n", "import os\n" + HEADER.splitlines()[0] + "\n")),  # outside
        ("reply", diff("    this line is not in the program\n", "    x = 1\n")),  # does not apply
    ]
    with ScriptedLLM(script) as server:
        res = _run(tmp_path, server, len(script))
        requests = len(server.requests)
    assert res.exit_code == 0, res.output
    assert not pwned.exists()
    summary = json.loads(res.output[res.output.index("{") :])
    archive = Archive(tmp_path / "arch", read_only=True)
    try:
        run = archive.run()
        assert run.config["engine"] == "openevolve"
        gens = archive.generations(run.id)
        assert [g.generation for g in gens] == list(range(len(script) + 1))  # one generation per iteration
        programs = archive.programs(run.id)
        seed, *children = programs
        assert seed.operator == "seed" and len(children) == 1
        child = children[0]
        assert child.operator == "openevolve" and child.parents == [seed.id] and child.full
        assert "1.5 * f.kv_write" in child.source and child.constants != seed.constants  # fitted, not the parent's
        assert {r.name for r in archive.metric_rows(child.id)} == {r.name for r in archive.metric_rows(seed.id)}
        rules = Counter(r.rule for r in archive.rejections(run.id))
        assert rules == {"llm-diff": 2, "call": 1, "top-level": 1, "evolve-block": 1}, rules
        assert all(r.operator == "openevolve" for r in archive.rejections(run.id))
        calls = archive.llm_calls(run.id)
        assert len(calls) == requests == len(script)
        assert [c.program_id for c in calls if c.program_id] == [child.id]
    finally:
        archive.close()
    assert summary["programs"] == 2 and summary["rejections"]["evolve-block"] == 1
    # the archive commands work on it as on one of ours
    shown = CliRunner().invoke(app, ["archive", "show", str(child.id), "--archive", str(tmp_path / "arch")])
    assert shown.exit_code == 0 and "openevolve" in shown.output
    listed = CliRunner().invoke(app, ["archive", "list", "--json", "--archive", str(tmp_path / "arch")])
    assert listed.exit_code == 0 and sorted(p["operator"] for p in json.loads(listed.output)) == [
        "openevolve",
        "seed:roofline",
    ]
    front = CliRunner().invoke(app, ["archive", "pareto", "--json", "--archive", str(tmp_path / "arch")])
    assert front.exit_code == 0 and {p["id"] for p in json.loads(front.output)} <= {seed.id, child.id}
    go = CliRunner().invoke(
        app,
        ["emit-go", str(child.id), "--archive", str(tmp_path / "arch"), "--out", str(tmp_path / "stepml_evolved.go")],
    )
    assert go.exit_code == 0, go.output
    assert "func " in (tmp_path / "stepml_evolved.go").read_text()


def test_rewrites_take_whole_programs_and_a_repeated_prompt_gets_its_own_reply(tmp_path):
    """--rewrites: OpenEvolve asks for whole programs; a reply without the block markers is all
    program. Iterations 1 and 2 send the same prompt (same parent, same database); each gets the
    next scripted reply, not the cached first one."""
    script = [
        ("reply", program_reply("n_req")),
        ("reply", program_reply("n_dc", "adds a decode term")),
        ("reply", PROSE_REPLY),
    ]
    with ScriptedLLM(script) as server:
        res = _run(tmp_path, server, len(script), "--rewrites")
        sent = server.requests
    assert res.exit_code == 0, res.output
    assert sent[0]["messages"] == sent[1]["messages"]
    archive = Archive(tmp_path / "arch", read_only=True)
    try:
        run = archive.run()
        children = [p for p in archive.programs(run.id) if p.operator == "openevolve"]
        assert sorted("f.n_req" in p.source for p in children) == [False, True]
        assert any("f.n_dc" in p.source for p in children)
        assert [r.rule for r in archive.rejections(run.id)] == ["syntax"]  # prose is parsed as a program, and fails
    finally:
        archive.close()


def test_openevolve_refusals_are_one_line_with_exit_2(tmp_path, monkeypatch):
    with ScriptedLLM(
        [("reply", diff(MEMORY_LINE, "    memory = f.weights + 2.0 * f.kv_read + f.kv_write\n"))]
    ) as server:
        first = _run(tmp_path, server, 1)
        assert first.exit_code == 0, first.output
        again = CliRunner().invoke(
            app,
            [
                "run",
                "--engine",
                "openevolve",
                "--generations",
                "2",
                "--resume",
                "--archive",
                str(tmp_path / "arch"),
                "--llm",
                "openai/test-model",
                "--llm-base-url",
                server.base_url,
                *SMALL,
            ],
        )
        ours = CliRunner().invoke(
            app, ["run", "--generations", "2", "--resume", "--archive", str(tmp_path / "arch"), *SMALL]
        )
    for res in (again, ours):
        assert res.exit_code == 2
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "cannot be resumed" in lines[0] and str(tmp_path / "arch") in lines[0], res.output
    no_llm = CliRunner().invoke(app, ["run", "--engine", "openevolve", "--archive", str(tmp_path / "x"), *SMALL])
    assert no_llm.exit_code == 2 and "needs an LLM: pass --llm" in no_llm.output
    assert not (tmp_path / "x").exists()
    # its candidates reach the judge without their parent: it runs with the parent rules off,
    # and refuses them on
    archive = Archive(tmp_path / "arch", read_only=True)
    try:
        search = archive.run().config["search"]
        assert (search["time_components"], search["unexercised"]) == ("free", "allow")
    finally:
        archive.close()
    for flag, on in (("--time-components", "keep"), ("--unexercised", "reject")):
        refused = CliRunner().invoke(
            app,
            ["run", "--engine", "openevolve", flag, on, "--llm", "openai/m"]
            + ["--archive", str(tmp_path / "x"), *SMALL],
        )
        assert refused.exit_code == 2 and len([line for line in refused.output.splitlines() if line.strip()]) == 1
        assert f"{flag} {on}: --engine openevolve" in refused.output and not (tmp_path / "x").exists()
    import stepml_evolve.evolve.openevolve.engine as engine

    monkeypatch.setattr(engine.metadata, "version", lambda name: "0.3.9")
    old = CliRunner().invoke(
        app, ["run", "--engine", "openevolve", "--llm", "openai/m", "--archive", str(tmp_path / "y"), *SMALL]
    )
    assert old.exit_code == 2 and "OpenEvolve 0.4.x" in old.output and "found 0.3.9" in old.output
    assert len([line for line in old.output.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "y").exists()


def test_the_evolve_block_is_the_program_and_nothing_outside_it_may_change():
    src = open(ROOFLINE).read()
    assert unwrap(as_program_file(src)) == (src.strip() + "\n", "")
    assert unwrap(src) == (src, "")  # a rewrite without the markers is all program
    block, why = unwrap("import os\n" + as_program_file(src))
    assert block is None and "outside the EVOLVE-BLOCK" in why
    block, why = unwrap(as_program_file(src) + "print(1)\n")
    assert block is None and "outside" in why
    block, why = unwrap(as_program_file(src) + as_program_file(src))
    assert block is None and "one EVOLVE-BLOCK" in why
    assert failure_rule("No valid diffs found in response") == "llm-diff"
    assert failure_rule("None of the 1 SEARCH block(s) matched the parent program") == "llm-diff"
    assert failure_rule("No valid code found in response") == "llm-no-code"
    assert failure_rule("LLM generation failed: Error code: 400 - LLM call cap reached (3 calls)") == "llm-budget"
    assert failure_rule("something new") == "openevolve-error"


@needs_real_data
def test_an_openevolve_run_on_the_real_data(tmp_path, real_codegen):
    script = [("reply", diff(MEMORY_LINE, "    memory = f.weights + f.kv_read + 2.0 * f.kv_write\n"))]
    with ScriptedLLM(script) as server:
        res = CliRunner().invoke(
            app,
            [
                "run",
                "--engine",
                "openevolve",
                "--generations",
                "1",
                "--seed",
                "7",
                "--data",
                str(real_codegen),
                "--archive",
                str(tmp_path / "arch"),
                "--llm",
                "openai/test-model",
                "--llm-base-url",
                server.base_url,
                "--seed-programs",
                ROOFLINE,
                "--seed-program-fit-evals",
                "6",
                "--full-fit-evals",
                "6",
                "--quick-evals",
                "4",
                "--front-cv",
                "none",
                "--residual",
                "0",
                *LEAN,
            ],
        )
    assert res.exit_code == 0, res.output
    archive = Archive(tmp_path / "arch", read_only=True)
    try:
        run = archive.run()
        child = [p for p in archive.programs(run.id) if p.operator == "openevolve"]
        assert len(child) == 1 and "2.0 * f.kv_write" in child[0].source
        if child[0].full:
            assert len({r.name for r in archive.metric_rows(child[0].id)}) == 4  # one run of each model
        else:
            assert child[0].quick_loss is not None and child[0].quick_loss > 0
    finally:
        archive.close()


def test_residual_term_answers_its_share_of_the_calls_and_its_children_are_archived_as_its_own(tmp_path):
    """--residual in OpenEvolve's engine: a share of the LLM calls is answered by a diff that adds
    the best screened term to the prompt's current program; the candidate is judged by our cascade
    and archived as a residual_term child of that program, and no LLM call is recorded for it."""
    # trained_physics: terms pass its screening on the built-in sample (the roofline's fitted residuals pass none)
    small = [str(ROOT / "seeds" / "trained_physics.py") if a == ROOFLINE else a for a in SMALL]
    with ScriptedLLM([("reply", PROSE_REPLY)] * 8) as server:
        res = _run(tmp_path, server, 3, "--residual", "0.99", small=small)
        requests = len(server.requests)
        # whole programs (--rewrites): the operator answers with the child's file
        rewrites = _run(tmp_path, server, 2, "--residual", "0.99", "--rewrites", small=small, archive="whole")
    assert res.exit_code == 0, res.output
    assert rewrites.exit_code == 0, rewrites.output
    whole = Archive(tmp_path / "whole", read_only=True)
    try:
        assert [p.operator for p in whole.programs()][1:] == ["residual_term"] * 2
    finally:
        whole.close()
    archive = Archive(tmp_path / "arch", read_only=True)
    try:
        run = archive.run()
        programs = archive.programs(run.id)
        seed = programs[0]
        aimed = [p for p in programs if p.operator == "residual_term"]
        refused = [r for r in archive.rejections(run.id) if r.operator == "residual_term"]
        assert aimed, refused
        for child in aimed:
            assert child.operator_detail.startswith("residual_term: + ") and "screened:" in child.operator_detail
            assert "(tether)" in child.operator_detail  # its coefficient bounded by its seed's tether
            assert child.parents and child.parents[0] in {p.id for p in programs}
            assert seed.source.split("def step_time")[0] != child.source.split("def step_time")[0]  # a new constant
        for r in refused:
            assert r.rule in ("screening", "residuals") and r.parents
        assert len(archive.llm_calls(run.id)) == requests < 3  # only the calls the LLM answered
    finally:
        archive.close()
