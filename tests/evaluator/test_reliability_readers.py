"""One reader rule for structured files (issue 55): a `--weights` file, a `--cv groups:` file, a
`.deployment.yaml`, an inference-perf JSON and an OTEL JSONL, each given the same small hostile
set (an integer past Python's 4,300-digit limit, a 5,000-digit hex integer, a 1 MB string, a list
or a mapping or a bool where a number or a name belongs, 5,000 levels of nesting, a malformed
document, bytes that are not UTF-8), answer each with one line naming the file (and the field
where known) that quotes at most a few dozen characters of what it found, and exit 2 on the
command line; never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import only_error_line
from typer.testing import CliRunner

from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fit.crossval import read_groups
from stepml_evolve.evaluator.importers.common import resolve_deployment
from stepml_evolve.evaluator.importers.inference_perf import read_inference_perf
from stepml_evolve.evaluator.importers.otel import read_otel
from stepml_evolve.evaluator.scoring.objectives import load_objective
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import seed_path

HUGE = "9" * 5000  # Python's int() refuses more than 4,300 digits
# the hostile set: a value put where the reader expects a number (or a list of names), as it is
# written in the file (YAML reads JSON's spelling of each), and what the line must say (None: the field)
VALUES = {
    "huge integer": (HUGE, "more than 4300 digits"),
    "huge hex integer": ("0x" + "f" * 5000, "more than 4300 digits"),  # YAML only
    "1 MB string": (json.dumps("x" * 1_000_000), None),
    "nested list": ("[1, [2, 3]]", None),
    "mapping": ('{"a": 1}', None),
    "bool": ("true", None),
}
DOCUMENTS = {  # the whole file
    "5,000 levels deep": (("[" * 5000 + "]" * 5000).encode(), "nested deeper than 64 levels"),
    "malformed": (b"{[: ,", ("not valid YAML", "malformed JSON")),
    "not UTF-8": (b"\xff\xfe{}", "not UTF-8"),
}
DEPLOY = {"model": "meta-llama/Llama-2-7b-hf", "hardware": "H100", "tp": 1, "max_num_seqs": 8}
DEPLOY |= {"max_num_batched_tokens": 2048, "kv_blocks": 5000, "block_size": 16}


def _ip(value: str) -> str:
    return (
        '[{"start_time": 1.0, "end_time": 2.0, "error": null, '
        f'"info": {{"input_tokens": {value}, "output_tokens": 0, "output_token_times": []}}}}]'
    )


def _otel(value: str) -> str:
    span = {
        "name": "llm_request",
        "startTimeUnixNano": "1000",
        "attributes": [
            {"key": "gen_ai.request.id", "value": {"stringValue": "@"}},  # an id of any type names the span
            {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "10"}},
            {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.1}},
            {"key": "gen_ai.latency.e2e", "value": {"doubleValue": "@"}},
        ],
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).replace('"@"', value) + "\n"


# reader -> (file name, the file holding a value, how the tool reads it, the field its line names, YAML?)
READERS = {
    "weights": ("w.yaml", lambda v: f"a-good: {v}\n", lambda p: load_objective("rms", p, ["a-good"]), "'a-good'", True),
    "groups": ("g.yaml", lambda v: f"f: {v}\n", lambda p: read_groups(p, ["a-good", "b"]), "fold 'f'", True),
    "deployment": (
        "m.deployment.yaml",
        lambda v: yaml.safe_dump({**DEPLOY, "tp": "@"}).replace("'@'", v),
        lambda p: resolve_deployment(p.parent / "m.json", {}, {}),
        "tp",
        True,
    ),
    "inference-perf": ("m.json", _ip, read_inference_perf, "info.input_tokens", False),
    "otel": ("s.jsonl", _otel, read_otel, "gen_ai.latency.e2e", False),
}
CASES = [
    (reader, case)
    for reader, spec in READERS.items()
    for case in [*VALUES, *DOCUMENTS]
    if spec[4] or case != "huge hex integer"
]


def _one_line(message: str, path, says) -> None:
    assert str(path) in message and "\n" not in message, message
    assert len(message) < 400, f"{len(message)} characters: {message[:300]}"
    assert any(s in message for s in ([says] if isinstance(says, str) else says)), message


@pytest.mark.parametrize("reader,case", CASES)
def test_every_structured_reader_answers_the_hostile_set_in_one_line_naming_the_file(tmp_path, reader, case):
    name, holding, read, field, _ = READERS[reader]
    path = tmp_path / name
    if case in VALUES:
        value, says = VALUES[case]
        path.write_text(holding(value))
    else:
        content, says = DOCUMENTS[case]
        path.write_bytes(content)
    with pytest.raises(UserError) as e:
        read(path)
    _one_line(str(e.value), path, says or field)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def data(synthetic, tmp_path_factory):
    """Two experiments of the small built-in sample, as a data directory."""
    d = tmp_path_factory.mktemp("data")
    for e in synthetic.experiments[:2]:
        shutil.copytree(synthetic.directory / e.name, d / e.name)
    return d


@pytest.mark.parametrize("reader", READERS)
def test_a_huge_integer_in_any_file_a_command_reads_is_one_error_line_and_exit_2(tmp_path, data, reader):
    name, holding, _, _, _ = READERS[reader]
    path = tmp_path / name
    path.write_text(holding(HUGE))
    program, out = seed_path("roofline"), tmp_path / "out"
    if reader in ("weights", "groups"):
        experiment = sorted(p.name for p in data.iterdir())[0]
        path.write_text(path.read_text().replace("a-good", experiment))
        flag = ["--weights", path] if reader == "weights" else ["--protocol", f"groups:{path}"]
        res = invoke("eval" if reader == "weights" else "cv", program, "--data", data, *flag)
    else:
        source = {"deployment": "inference-perf", "inference-perf": "inference-perf", "otel": "otel"}[reader]
        if reader == "deployment":
            (tmp_path / "m.json").write_text(_ip("300"))
        else:
            (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(DEPLOY))
        src = tmp_path / ("m.json" if source == "inference-perf" else name)
        res = invoke("data", "import", "--from", source, src, "--out", out)
    only_error_line(res, str(path), "holds an integer of more than 4300 digits")
    assert not out.exists()
