"""Bad input on the way in (issue 27): pathological experiment files, programs that are not
regular files, bad experiments in eval/fit/cv/run (--skip-bad), LLM options without an LLM, and
programs that fail or overflow everywhere. Each is one `error:` line naming the file (or flag)
and the problem, exit 2, and the good experiments still reported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from stepml_evolve.evaluator.data.experiment_reader import load_experiments
from stepml_evolve.evaluator.dsl import ProgramError, parse_program
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.seeds import seed_path

SOURCE = "synth-llama-2-7b-tp1-general"  # of the small built-in sample (conftest sets STEPML_SAMPLE_SIZE=small)
ESCAPE_NAME = "\x1b[31mred\x1b[0m"  # a directory name that would recolour a terminal
ZERO = 'CONSTANTS = {"a": 1.0}\ndef step_time(f, c):\n    return c.a - c.a\n'
OVERFLOW = 'CONSTANTS = {"a": 1.0, "b": 2.0}\ndef step_time(f, c):\n    return exp(exp(exp(c.a * 10))) + c.b\n'


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def error_lines(res) -> list[str]:
    assert "Traceback" not in res.output, res.output
    return [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]


def copy_experiment(src, dst):
    dst.mkdir(parents=True)
    for name in ("requests.json", "ground_truth.json", "profile.json"):
        shutil.copy(src / name, dst / name)
    return dst


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.fixture
def source(synthetic):
    return synthetic.directory / SOURCE


# each: directory name -> (how it is broken, what its one error line must say)
PATHOLOGICAL = {
    "deep": (
        lambda d: (d / "requests.json").write_text("[" * 200_000 + "]" * 200_000),
        "requests.json: nested deeper than 64 levels",
    ),
    "huge-input": (
        lambda d: edit(d / "requests.json", lambda r: r["requests"][0].update(input_tokens=10**12)),
        "requests.json: input_tokens of record 0 must be an integer in 0..10,000,000",
    ),
    "huge-kv": (
        lambda d: edit(d / "requests.json", lambda r: r["config"].update(kv_blocks_total_gpu=10**18)),
        "requests.json: config.kv_blocks_total_gpu must be an integer in 1..10,000,000",
    ),
    "huge-tp": (
        lambda d: edit(d / "requests.json", lambda r: r["config"].update(tensor_parallelism=10**9)),
        "requests.json: config.tensor_parallelism must be an integer in 1..64",
    ),
    "all-requests-long": (
        lambda d: edit(d / "requests.json", lambda r: [q.update(input_tokens=9_000_000) for q in r["requests"]]),
        "over the replay's limit of 100,000,000",
    ),
    "string-e2e": (
        lambda d: edit(d / "ground_truth.json", lambda t: t[0].update(e2e_s="1.5")),
        "ground_truth.json: e2e_s of record 0 must be a number of seconds",
    ),
    "bool-ttft": (
        lambda d: edit(d / "ground_truth.json", lambda t: t[1].update(ttft_s=True)),
        "ground_truth.json: ttft_s of record 1 must be a number of seconds",
    ),
    "string-experts": (
        lambda d: edit(d / "requests.json", lambda r: r["model_config"].update(num_local_experts="8")),
        "requests.json: model_config.num_local_experts must be an integer",
    ),
    "profile-shape": (
        lambda d: edit(d / "profile.json", lambda p: p.update(data=[1])),
        "profile.json: data must be an object",
    ),
    "profile-output-len": (
        lambda d: edit(d / "profile.json", lambda p: p["data"]["shared_prefix"].update(output_len="248")),
        "profile.json: data.shared_prefix.output_len must be an integer",
    ),
    "profile-broken": (lambda d: (d / "profile.json").write_text("{not json"), "profile.json: malformed JSON"),
    "huge-file": (
        lambda d: os.truncate(d / "ground_truth.json", (1 << 30) + 1),  # sparse: refused before reading
        "ground_truth.json: is 1 GiB, over the 1 GiB limit",
    ),
}


@pytest.fixture
def pathological(tmp_path, source):
    copy_experiment(source, tmp_path / "a-good")
    copy_experiment(source, tmp_path / ESCAPE_NAME)
    for name, (breaks, _) in PATHOLOGICAL.items():
        breaks(copy_experiment(source, tmp_path / name))
    return tmp_path


def test_pathological_experiments_are_one_line_each_and_the_good_ones_still_reported(pathological):
    res = invoke("data", "check", "--data", pathological)
    assert res.exit_code == 2
    lines = error_lines(res)
    for name, (_, says) in PATHOLOGICAL.items():
        (line,) = [ln for ln in lines if ln.startswith(f"error: {name}: ")]
        assert says in line, line
    assert len(lines) == len(PATHOLOGICAL)
    assert "a-good" in res.stdout
    # the escape sequence is shown, never sent to the terminal
    assert "\x1b" not in res.output and "\\x1b[31mred\\x1b[0m" in res.stdout


def test_what_data_check_passes_eval_replays_and_what_it_refuses_eval_refuses_alike(pathological):
    good, bad = load_experiments(pathological)
    assert sorted(e.name for e in good) == sorted(["a-good", ESCAPE_NAME])
    res = invoke("eval", seed_path("roofline"), "--data", pathological)
    assert res.exit_code == 2
    lines = error_lines(res)
    assert len(lines) == len(PATHOLOGICAL) + 1  # one per bad experiment, then what to do
    assert f"{len(PATHOLOGICAL)} of {len(PATHOLOGICAL) + 2} experiments do not load" in lines[-1]
    assert "--skip-bad" in lines[-1]
    assert "a-good" in res.stdout and "loss (test):" in res.stdout  # the good ones are scored first
    assert "\x1b" not in res.output


@pytest.fixture
def one_bad(tmp_path, source):
    data = tmp_path / "data"
    copy_experiment(source, data / "a-good")
    edit(copy_experiment(source, data / "b-bad") / "requests.json", lambda r: r["config"].update(block_size="16"))
    return data


def test_a_bad_experiment_stops_eval_fit_cv_and_run_unless_skip_bad(one_bad, tmp_path):
    says = "b-bad: requests.json: config.block_size must be an integer in 1..65,536, not '16'"
    program = tmp_path / "rf.py"
    program.write_text(seed_path("roofline").read_text())
    fitted, archive = tmp_path / "rf.fitted.py", tmp_path / "archive"
    for cmd in (
        ["eval", program],
        ["fit", program, "--max-evals", 8, "--out", fitted],
        ["cv", program, "--protocol", "lomo", "--max-evals", 8],
        ["run", "--generations", 0, "--seed-program-fit-evals", 8, "--archive", archive],
    ):
        res = invoke(*cmd, "--data", one_bad)
        assert res.exit_code == 2, (cmd, res.output)
        first, last = error_lines(res)
        assert first == f"error: {says}" and "1 of 2 experiments do not load" in last, res.stderr
    assert not fitted.exists() and not archive.exists()
    res = invoke("eval", program, "--data", one_bad, "--skip-bad")
    assert res.exit_code == 0, res.output
    assert f"skipped: {says}" in res.stderr and not error_lines(res)


def test_a_program_that_is_not_a_regular_file_or_too_big_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("# padding\n" * 10_000)
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    for path, says in (
        ("/dev/zero", "is a character device, not a regular file"),
        (tmp_path, "is a directory, not a regular file"),
        (big, "is 97.7 KiB, over the 62.5 KiB limit for this file"),
    ):
        (line,) = error_lines(invoke("eval", path))
        assert line == f"error: {path}: cannot read program: {says} [file]"
    (line,) = error_lines(invoke("run", "--seed-programs", "/dev/zero", "--archive", tmp_path / "never"))
    assert "/dev/zero: cannot read program: is a character device" in line
    # a FIFO without a writer: in a subprocess, so that a regression fails instead of hanging the suite
    done = subprocess.run(
        [sys.executable, "-m", "stepml_evolve.evolve", "eval", str(fifo)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and f"{fifo}: cannot read program: is a FIFO" in done.stderr, done.stderr


def test_llm_options_without_llm_are_refused_in_one_line(tmp_path):
    res = invoke("run", "--llm-base-url", "http://127.0.0.1:9/v1", "--archive", tmp_path / "never")
    assert res.exit_code == 2
    assert error_lines(res) == ["error: --llm-base-url: needs --llm MODEL (without it the option would be ignored)"]
    res = invoke("run", "--max-llm-calls", 3, "--llm-offline", "--archive", tmp_path / "never")
    assert error_lines(res)[0].startswith("error: --llm-offline, --max-llm-calls: needs --llm MODEL")
    assert not (tmp_path / "never").exists()


def test_a_program_failing_on_every_experiment_is_one_line_and_an_overflow_fails_eval_and_fit_alike(one_bad, tmp_path):
    zero, overflow = tmp_path / "zero.py", tmp_path / "overflow.py"
    zero.write_text(ZERO)
    overflow.write_text(OVERFLOW)
    copy_experiment(one_bad / "a-good", one_bad.parent / "two" / "a")
    copy_experiment(one_bad / "a-good", one_bad.parent / "two" / "b")
    two = one_bad.parent / "two"
    res = invoke("eval", zero, "--data", two)
    assert res.exit_code == 2 and "loss" not in res.stdout
    assert error_lines(res) == [
        f"error: {zero}: fails to replay on every experiment (2); on a: step_time returned 0 "
        "(must be finite, positive and at most 1e+15 us) at step 0"
    ]
    # exp is clamped, so exp(exp(exp(x))) is finite but a step of 5.5e34 us: an overflow for both
    (line,) = error_lines(invoke("eval", overflow, "--data", two))
    assert "step_time returned 5.54062e+34 (must be finite, positive and at most 1e+15 us)" in line
    (line,) = error_lines(invoke("fit", overflow, "--data", two, "--max-evals", 8, "--out", tmp_path / "o.py"))
    assert (
        line
        == f"error: {overflow}: step_time was non-finite, non-positive or over 1e15 us for every constant vector tried; nothing written"
    )
    assert not (tmp_path / "o.py").exists()


def test_an_over_long_numeric_literal_is_the_dsl_s_own_rule(tmp_path):
    for literal in ("9" * 5000, "1." + "5" * 100):
        with pytest.raises(ProgramError) as e:
            parse_program(f'CONSTANTS = {{"a": 1.0}}\ndef step_time(f, c):\n    return c.a * {literal}\n')
        assert e.value.rule == "literal" and e.value.line == 3
        assert "at most 64" in str(e.value) and "set_int_max_str_digits" not in str(e.value)
    parse_program("def step_time(f, c):\n    return 1.2345678901234567e-10 * f.tokens + 1_000_000.0\n")


def test_weights_and_groups_files_nested_too_deep_or_not_regular_are_one_line(tmp_path, one_bad):
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    program = seed_path("roofline")
    for weights, says in ((deep, "nested deeper than 64 levels"), ("/dev/zero", "is a character device")):
        (line,) = error_lines(invoke("eval", program, "--data", one_bad / "a-good", "--weights", weights))
        assert line.startswith(f"error: {weights}: ") and says in line, line
