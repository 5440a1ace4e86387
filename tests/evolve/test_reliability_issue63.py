"""Bad input of issue 63, each one line naming the input and the problem, exit 2, nothing written
and nothing lost: a hostile `bench --reference` file is refused before any timing; an
`--llm-timeout` outside its range is refused, and a call the deadline cut is never served from
the cache as the LLM's answer; a world law whose times the experiment reader cannot hold is
refused before anything is written (and a world synth writes always passes `data check`); the
synthetic-sample cache is built whole or not at all on a full disk; and the smaller items (a
non-path program in the Python API, a corrupt priors table, a deployment vLLM refuses, a full
disk under a run, SIGTERM to a run, a newline in the archive's path, `--within 1e308`, a flat
sum of 6,000 terms)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import ONE_SEED_SCREENED, archive_rows, only_error_line
from llm_server import ScriptedLLM
from typer.testing import CliRunner

import stepml_evolve
from stepml_evolve.evaluator.dsl import ProgramError, parse_program
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.search.llm_client import LLMClient, LLMUnavailable
from stepml_evolve.seeds import SeedError, priors_markdown

SOURCE = "synth-llama-2-7b-tp1-general"  # of the small built-in sample: Llama-2-7b, 32 heads, 128 seqs


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def evolve(*args, file_size_limit: int | None = None, env: dict | None = None, **popen):
    """`python -m stepml_evolve.evolve ARGS` in a real process; with file_size_limit, one whose
    files may not grow past that many bytes (Python ignores SIGXFSZ, so the write past it fails
    with EFBIG, as one on a full disk fails with ENOSPC). The limit is set by a small Python that
    then execs the command, not by preexec_fn (see test_reliability_synth.py)."""
    command = [sys.executable, "-m", "stepml_evolve.evolve", *map(str, args)]
    if file_size_limit is not None:
        command = [
            sys.executable,
            "-c",
            "import os, resource, sys; limit = int(sys.argv[1]); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); os.execv(sys.argv[2], sys.argv[2:])",
            str(file_size_limit),
            *command,
        ]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})}, **popen)


def only_error_line_of(proc: subprocess.CompletedProcess, *texts) -> str:
    """As conftest.only_error_line, for a real process."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-3000:]
    assert all(t in errors[0] for t in texts), errors[0]
    return errors[0]


# ---- 2. evolve bench --reference ----

REFERENCE = {"data": "synthetic", "replay_s_largest": 0.01, "full_eval_s": 0.02, "quick_fit_s": 0.5}
HOSTILE_REFERENCES = {
    "5000-digit integer": (b'{"full_eval_s": ' + b"9" * 5000 + b"}", "holds an integer of more than 4300 digits"),
    "200k-deep nesting": (b"[" * 200_000 + b"]" * 200_000, "nested deeper than 64 levels"),
    "binary garbage": (bytes(range(256)) * 4, "not UTF-8"),
}


def _bench_with_reference(synthetic, reference):
    return invoke(
        "bench", "--data", synthetic.directory, "--skip-fit", "--search-generations", 0, "--reference", reference
    )


@pytest.mark.parametrize("case", HOSTILE_REFERENCES)
def test_a_hostile_reference_file_is_one_line_before_timing(synthetic, tmp_path, case):
    content, says = HOSTILE_REFERENCES[case]
    reference = tmp_path / "reference.json"
    reference.write_bytes(content)
    res = _bench_with_reference(synthetic, reference)
    only_error_line(res, str(reference), says)
    assert "replay:" not in res.stderr  # no timing started


@pytest.mark.parametrize("figure", ["1e400", "NaN", '"fast"', "-1.5", "true"])
def test_reference_with_a_non_finite_or_non_numeric_figure_is_refused_by_name_before_timing(
    synthetic, tmp_path, figure
):
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps(REFERENCE).replace('"full_eval_s": 0.02', f'"full_eval_s": {figure}'))
    res = _bench_with_reference(synthetic, reference)
    only_error_line(res, str(reference), "figure full_eval_s is", "not a finite number")
    assert "replay:" not in res.stderr


# ---- 3. --llm-timeout ----


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "1e400"])
def test_an_llm_timeout_that_is_not_a_finite_positive_time_is_refused_before_anything_is_written(tmp_path, timeout):
    archive = tmp_path / "A"
    res = invoke(
        "run", "--llm", "openai/test-model", "--llm-timeout", timeout, "--generations", 0, "--archive", archive
    )
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "Invalid value for '--llm-timeout'" in res.stderr, res.stderr
    assert not archive.exists()


def test_a_call_cut_at_its_deadline_is_never_served_from_the_cache_as_the_llms_answer(tmp_path):
    """A deadline is a setting, not the LLM's answer: the failure is kept for an offline replay of
    the run, but a client that may call out asks again, and caches the real reply."""
    messages = [{"role": "user", "content": "a program, please"}]
    cache = tmp_path / "llm_cache"
    slow = threading.Event()  # while set, the server answers after 3 s (whichever request it is)
    slow.set()

    def answer(n: int) -> str:
        if slow.is_set():
            time.sleep(3.0)
            return "too late"
        return "the real reply"

    with ScriptedLLM([], default=answer) as server:
        short = LLMClient("openai/test-model", cache, base_url=server.base_url, timeout_s=0.5, max_retries=0)
        with pytest.raises(LLMUnavailable) as cut:
            short.complete(messages)
        assert [a.outcome for a in cut.value.attempts] == ["timeout"]
        with pytest.raises(LLMUnavailable) as replayed:  # offline: the run replays as it happened
            LLMClient("openai/test-model", cache, offline=True).complete(messages)
        assert [(a.outcome, a.cached) for a in replayed.value.attempts] == [("timeout", True)]
        slow.clear()
        patient = LLMClient("openai/test-model", cache, base_url=server.base_url, timeout_s=30.0, max_retries=0)
        reply = patient.complete(messages)
        assert reply.content == "the real reply" and not reply.attempts[0].cached
    again = LLMClient("openai/test-model", cache, offline=True).complete(messages)  # the reply is what is cached
    assert again.content == "the real reply" and again.attempts[0].cached


# ---- 4. a world law is checked before anything is written ----

LAWS = {
    # name -> (the law's functions after CONSTANTS, None: written and `data check` accepts it, else what the refusal says)
    "huge_output_token_time": (
        "def step_time(f, c):\n    return 1000.0 + c.a * f.weights\n\n\n"
        "def output_token_time(c):\n    return 1e13 * c.a\n",
        "past the 1e+09 s (1e+15 us) an experiment may hold",
    ),
    "tiny_step": ("def step_time(f, c):\n    return 1e-6 * c.a + 0.0 * f.weights\n", "under the replay's resolution"),
    "zero_step": ("def step_time(f, c):\n    return 0.0 * c.a * f.weights\n", "step_time returned 0"),
    "negative_step": ("def step_time(f, c):\n    return -1000.0 * c.a - f.weights\n", "step_time returned -"),
    "negative_output_token_time": (
        "def step_time(f, c):\n    return 1000.0 + c.a * f.weights\n\n\n"
        "def output_token_time(c):\n    return -5.0 * c.a\n",
        "output_token_time is -5 us, not a duration",
    ),
    "overflowing_step": (
        "def step_time(f, c):\n    return f.weights * exp(exp(exp(c.a * 10))) + c.a * f.weights\n",
        "must be finite, positive and at most 1e+15 us",
    ),
    "huge_step": ("def step_time(f, c):\n    return 1e9 * c.a + f.weights\n", "not the step time of a server"),
    "huge_post_decode_time": (
        "def step_time(f, c):\n    return 1000.0 + c.a * f.weights\n\n\n"
        "def post_decode_time(c):\n    return 1e13 * c.a\n",
        None,
    ),
}


@pytest.mark.parametrize("name", LAWS)
def test_a_hostile_world_law_is_refused_before_writing_or_written_so_that_data_check_accepts_it(tmp_path, name):
    body, refusal = LAWS[name]
    law = tmp_path / f"{name}.py"
    law.write_text(f'"""Hostile: {name}."""\nCONSTANTS = {{"a": 1.0}}\n\n\n{body}')
    out = tmp_path / "world"
    res = invoke("data", "synth", "--world", law, "--size", "small", "--out", out)
    if refusal is not None:
        only_error_line(res, f"world {name}:", refusal, "nothing written")
        assert os.listdir(tmp_path) == [law.name]  # nor a temporary directory beside it
        return
    assert res.exit_code == 0, res.output
    check = invoke("data", "check", "--data", out)
    assert check.exit_code == 0 and "error:" not in check.stderr, check.stderr[-3000:]


# ---- 5. the synthetic-sample cache on a full disk ----


def test_a_cache_build_that_fails_half_way_is_one_line_and_leaves_no_temporary_directory(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {"STEPML_CACHE": str(cache), "STEPML_SAMPLE_SIZE": "small"}
    proc = evolve("data", "check", file_size_limit=20_000, env=env)  # the small sample's files are 31 KB and up
    only_error_line_of(proc, str(cache), "cannot write the built-in synthetic sample", "nothing written")
    assert os.listdir(cache) == []  # no .synthetic-* left behind
    again = evolve("data", "check", env=env)  # the disk freed: the cache builds
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p for p in os.listdir(cache) if p.startswith(".")] == []


# ---- 6. the smaller items ----


def test_score_of_a_number_is_a_one_line_user_error_naming_the_argument():
    with pytest.raises(UserError) as e:
        stepml_evolve.score(12345)
    message = str(e.value)
    assert "\n" not in message and message.startswith("program must be") and "12345" in message, message


@pytest.mark.parametrize(
    "content,says",
    [
        (
            "quantities:\n  q: {centre: 1.0, spread: abc, unit: x, source: s}\nconstants: {}\n",
            "quantities.q.spread must be a number above 0",
        ),
        (
            "quantities:\n  q: {centre: 1.0, spread: 0.1, unit: x, source: s}\nconstants: {roofline: {c: nope}}\n",
            "constants.roofline.c names 'nope', not a quantity",
        ),
        ("quantities: [1, 2]\n", "expected a mapping with a 'quantities' mapping"),
        ("quantities: {q: [\n", "not valid YAML"),
    ],
)
def test_a_corrupt_priors_table_is_one_line_naming_the_file(tmp_path, content, says):
    path = tmp_path / "priors.yaml"
    path.write_text(content)
    with pytest.raises(SeedError) as e:
        priors_markdown(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and says in message, message


@pytest.mark.parametrize(
    "config,says",
    [
        (
            {"tensor_parallelism": 3},
            "config.tensor_parallelism 3 does not divide the model's 32 attention heads (model_config.num_heads): "
            "vLLM refuses such a deployment",
        ),
        (
            {"max_num_batched_tokens": 1},
            "config.max_num_batched_tokens 1 is under one KV block (config.block_size 16): a step's token budget "
            "must hold at least one block",
        ),
    ],
)
def test_data_check_refuses_a_deployment_no_server_runs(synthetic, tmp_path, config, says):
    data = tmp_path / "data"
    shutil.copytree(synthetic.directory / SOURCE, data / "bad")
    requests = data / "bad" / "requests.json"
    document = json.loads(requests.read_text())
    document["config"].update(config)
    requests.write_text(json.dumps(document))
    only_error_line(invoke("data", "check", "--data", data), "error: bad: requests.json: ", says)


def test_a_full_disk_under_a_run_says_a_write_to_the_archive_failed(synthetic, tmp_path):
    archive = tmp_path / "A"
    proc = evolve(
        "run", "--generations", 2, "--seed", 3, "--children", 2, "--archive", archive, *ONE_SEED_SCREENED,
        file_size_limit=48_000,
    )  # fmt: skip
    line = only_error_line_of(proc, str(archive), "a write to the archive failed", "the disk is full")
    assert "not a readable archive" not in line


def test_sigterm_to_a_run_says_what_it_kept_and_how_to_resume(synthetic, tmp_path):
    archive = tmp_path / "A"
    command = [sys.executable, "-m", "stepml_evolve.evolve", "run", "--generations", "500", "--seed", "3"]
    command += ["--children", "2", "--archive", str(archive), *ONE_SEED_SCREENED]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 300
        while time.monotonic() < end:  # until a generation after 0 is completed
            line = proc.stderr.readline()
            if line.startswith("gen 2 ") or not line:
                break
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    (kept,) = archive_rows(archive, "SELECT MAX(generation) FROM generations")[0]
    assert kept >= 2
    assert last == (
        f"stopped by SIGTERM: {archive} keeps generations 0 to {kept}; `evolve run --resume --archive {archive}` "
        f"with the same options continues from generation {kept + 1}"
    ), last


@pytest.fixture(scope="module")
def newline_archive(tmp_path_factory):
    """A one-seed run (generation 0, screening fits only) into a directory whose name holds a
    newline; the CliRunner result and the directory."""
    archive = tmp_path_factory.mktemp("nl") / "runs\nnext"
    res = invoke("run", "--generations", 0, "--archive", archive, "--seed", 3, "--children", 2, *ONE_SEED_SCREENED)
    assert res.exit_code == 0, res.output
    return res, archive


def test_the_runs_archive_line_shows_a_newline_in_the_path_escaped(newline_archive):
    res, archive = newline_archive
    lines = res.stdout.splitlines()
    (line,) = [ln for ln in lines if ln.startswith("archive: ")]
    assert line == "archive: " + str(archive).replace("\n", "\\n") + "  (browse: evolve archive list --archive " + (
        str(archive).replace("\n", "\\n") + ")"
    )
    assert not any(ln.startswith("next") for ln in lines) and not any(
        ln.startswith("next") for ln in res.stderr.splitlines()
    )


def test_within_1e308_prints_a_short_limit(newline_archive, tmp_path):
    _, archive = newline_archive
    out = tmp_path / "m.go"
    res = invoke("emit-go", "simplest", "--within", "1e308", "--archive", archive, "--out", out)
    assert res.exit_code == 0, res.output
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("simplest within")]
    assert "1e+308%" in line and "limit " in line and len(line) < 300, line
    assert all(len(ln) < 400 for ln in out.read_text().splitlines())


@pytest.mark.parametrize("terms", [1000, 6000])
def test_a_flat_sum_of_thousands_of_terms_is_refused_by_the_size_rule(terms):
    source = 'CONSTANTS = {"a": 1.0}\n\n\ndef step_time(f, c):\n    return ' + " + ".join(["f.n_req"] * terms) + "\n"
    with pytest.raises(ProgramError) as e:
        parse_program(source)
    assert "more than 400 expression nodes" in str(e.value) and e.value.rule == "size", str(e.value)
    assert "nested" not in str(e.value)
