"""The `# fitted:` header: rendered and parsed by one module, in both of its forms, and what
`evolve fit` and `evolve archive show --source` write parses back to where the constants came from."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from typer.testing import CliRunner

from stepml_evolve.archive.records import GenerationRecord, NewProgram, ProgramRecord
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.dsl import load_program, parse_program
from stepml_evolve.evaluator.fit.fitted_header import FittedHeader, header_lines
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import seed_path

FIT = FittedHeader(
    data="synthetic sample (/tmp/with space/synthetic-v1-seed0)",
    seed=5,
    scope="model",
    group="meta-llama/Llama-2-7b-hf",
    restarts=2,
    quick=True,
    train_loss=12.3457,
    loss_of_all_groups=True,
    evaluations=161,
)
ARCHIVED = FittedHeader(
    data="../shared/data/replay",
    seed=7,
    program_id=266,
    archive="runs/real seed7",
    generation=58,
    operator="llm:openai/gpt-4o-mini",
    train_loss=25.1234,
    val_loss=None,
    test_loss=math.inf,
)


def in_source(header: FittedHeader) -> str:
    return parse_program(seed_path("roofline").read_text()).with_constants({}, header=header.render()).source


@pytest.mark.parametrize(
    "header",
    [
        FIT,
        dataclasses.replace(FIT, restarts=0, quick=False, loss_of_all_groups=False),
        ARCHIVED,
        dataclasses.replace(ARCHIVED, val_loss=0.5, test_loss=None),
    ],
)
def test_render_then_parse_gives_the_same_fields_and_text(header):
    source = in_source(header)
    back = FittedHeader.parse(source)
    assert back == header
    assert "\n".join(header_lines(source)) == back.render() == header.render()


def test_the_two_forms_as_written_today():
    assert FIT.render() == (
        "data=synthetic sample (/tmp/with space/synthetic-v1-seed0) seed=5 scope=model "
        "group=meta-llama/Llama-2-7b-hf restarts=2 quick prompt_reuse=detect train_loss_all_groups=12.3457 "
        "evaluations=161"
    )
    assert ARCHIVED.render() == (
        "program #266 of runs/real seed7 (generation 58, llm:openai/gpt-4o-mini)\n"
        "data=../shared/data/replay seed=7 prompt_reuse=detect train=25.1234 val=n/a test=inf"
    )


def test_a_header_from_before_prompt_reuse_reads_as_system_prompts_only():
    """Fits and archives written before --prompt-reuse existed replayed the shared system prompts only."""
    old_fit = "# fitted: data=d seed=7 scope=global group=all train_loss=1.0000 evaluations=3\nCONSTANTS = {}\n"
    old_archived = (
        "# fitted: program #3 of runs/x (generation 1, seed:roofline)\n# fitted: data=d seed=7 train=1 val=2 test=3\n"
    )
    assert FittedHeader.parse(old_fit).prompt_reuse == "system-prompt"
    assert FittedHeader.parse(old_archived).prompt_reuse == "system-prompt"
    assert FittedHeader.parse(in_source(dataclasses.replace(FIT, prompt_reuse="off"))).prompt_reuse == "off"


def test_a_program_without_a_header_or_with_a_foreign_one_parses_to_none():
    assert FittedHeader.parse(seed_path("roofline").read_text()) is None
    assert FittedHeader.parse("# fitted: by hand, on a Tuesday\nCONSTANTS = {}\n") is None


def test_the_file_evolve_fit_writes_parses(tmp_path):
    out = tmp_path / "rf.fitted.py"
    res = CliRunner().invoke(
        app, ["fit", str(seed_path("roofline")), "--seed", "3", "--max-evals", "8", "--out", str(out), "--json"]
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    header = FittedHeader.parse(out.read_text())
    assert (header.data, header.seed, header.scope, header.group, header.evaluations, header.prompt_reuse) == (
        payload["data"],
        3,
        "global",
        "all",
        payload["evaluations"],
        payload["prompt_reuse"],
    )
    assert header.train_loss == pytest.approx(payload["train_loss"], abs=5e-5) and header.program_id is None


def test_the_file_archive_show_source_prints_parses(tmp_path):
    a = Archive(tmp_path, create=True)
    run_id = a.create_run("data dir", "fp", False, 11, {})
    prog = load_program(seed_path("roofline"))
    record = ProgramRecord(
        id=None,
        source_hash="h",
        source=prog.source,
        constants=dict(prog.constants),
        operator="seed",
        operator_detail="roofline",
        complexity=prog.complexity,
        n_components=len(prog.components_used),
        components=prog.components_used,
        stage="seed",
        train_loss=1.5,
        val_loss=2.25,
        test_loss=3.125,
    )
    (pid,) = a.write_generation(run_id, 0, 1.0, [NewProgram(record)], [], [], GenerationRecord())
    a.close()
    res = CliRunner().invoke(app, ["archive", "show", str(pid), "--source", "--archive", str(tmp_path)])
    assert res.exit_code == 0, res.output
    header = FittedHeader.parse(res.stdout)
    # a run stored without the setting replayed system prompts only
    assert header == FittedHeader(
        data="data dir",
        seed=11,
        program_id=pid,
        archive=str(tmp_path),
        generation=0,
        operator="seed:roofline",
        train_loss=1.5,
        val_loss=2.25,
        test_loss=3.125,
        prompt_reuse="system-prompt",
    )
    assert parse_program(res.stdout).constants == prog.constants


def test_the_labelled_form_for_a_go_header():
    assert ARCHIVED.labelled() == {
        "program": "#266 of runs/real seed7 (generation 58, llm:openai/gpt-4o-mini)",
        "data": "../shared/data/replay",
        "seed": "7",
        "prompt reuse": "detect",
        "loss": "train 25.1234, validation n/a, test inf",
    }
