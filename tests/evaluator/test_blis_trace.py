"""`evolve data export --blis-trace`: an experiment as a BLIS trace v2 that parses back to the
tool's arrays, that BLIS accepts and replays, and bad input answered with one line."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import shlex
import subprocess

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from stepml_evolve.evaluator.data.experiment_reader import load_experiment
from stepml_evolve.evaluator.hardware.model_arch import ModelArch
from stepml_evolve.evaluator.importers.blis_trace_export import (
    TRACE_COLUMNS,
    BlisTraceError,
    export_blis_trace,
    export_experiment_dir,
    read_blis_results,
)

CODEGEN = "20260217-155451-llama-2-7b-tp1-codegen"
REASONING = "20260217-170634-llama-2-7b-tp1-reasoning"  # overloaded: most requests time out
# sim/workload/tracev2.go: TraceHeader and TraceServerConfig yaml keys (read with KnownFields(true))
HEADER_KEYS = {
    "trace_version",
    "time_unit",
    "created_at",
    "mode",
    "warm_up_requests",
    "workload_seed",
    "workload_spec",
    "session_context_growth",
    "server",
    "network",
    "goodput_slo_targets",
    "kv_offload",
    "observed_kv_metrics",
}
SERVER_KEYS = {
    "type",
    "model",
    "tensor_parallel",
    "max_num_seqs",
    "block_size",
    "gpu_memory_utilization",
    "max_model_len",
}
INT_COLUMNS = {
    "request_id",
    "round_index",
    "prefix_length",
    "input_tokens",
    "output_tokens",
    "text_tokens",
    "image_tokens",
    "audio_tokens",
    "video_tokens",
    "deadline_us",
    "server_input_tokens",
    "arrival_time_us",
    "send_time_us",
    "first_chunk_time_us",
    "last_chunk_time_us",
    "num_chunks",
}


def cli(*args):
    from stepml_evolve.evolve.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


def read_trace(data_path):
    with open(data_path, newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == TRACE_COLUMNS
    out = {c: [] for c in TRACE_COLUMNS}
    for row in rows[1:]:
        assert len(row) == len(TRACE_COLUMNS)
        for c, v in zip(TRACE_COLUMNS, row):
            out[c].append(int(v) if c in INT_COLUMNS else v)  # every int cell filled: int("") fails
    return {c: np.array(v) if c in INT_COLUMNS else v for c, v in out.items()}


def check_export(exp, e, n=None):
    """The files parse back to the experiment's arrays (first n requests)."""
    n = e.n_requests if n is None else n
    t = read_trace(exp.data)
    assert len(t["request_id"]) == n and (t["request_id"] == np.arange(n)).all()
    arrival = e.arrival_us[:n]
    assert (t["arrival_time_us"] == arrival).all() and (t["send_time_us"] == arrival).all()
    # the prompts as a trace states them (Experiment.trace_view): a resent prompt is one group over the
    # whole prompt ("p<prompt>", no suffix), another shared prefix its group ("sp<g>"), the rest none
    view, names = e.trace_view()
    groups = view.prefix_group[:n]
    grouped = np.array([g != "" for g in t["prefix_group"]])
    assert (grouped == (groups >= 0)).all()
    assert [g for g in t["prefix_group"] if g] == [names[k] for k in groups[groups >= 0]]
    lengths = np.array(view.group_tokens + (0,))[groups]
    assert (t["prefix_length"][grouped] == lengths[grouped]).all() and (t["prefix_length"][~grouped] == 0).all()
    whole = np.array([g.startswith("p") for g in t["prefix_group"]])
    assert (t["input_tokens"][whole] == 0).all()
    if e.prompt_reuse is not None and e.prompt_reuse.model == "cycle":
        assert whole.mean() > 0.9  # the cycled prompts are sent again and again
    assert (t["prefix_length"] + t["input_tokens"] == e.input_tokens[:n]).all()  # BLIS's prompt length
    assert (t["server_input_tokens"] == e.input_tokens[:n]).all()
    assert (t["output_tokens"] == e.output_tokens[:n]).all()
    assert (t["deadline_us"] - t["arrival_time_us"] == e.abort_after_us[:n]).all()
    ok = ~e.failed[:n]
    status = np.array(t["status"])
    assert (status[ok] == "ok").all() and (status[~ok] == "timeout").all()
    assert np.allclose((t["first_chunk_time_us"] - arrival)[ok], e.ttft_s[:n][ok] * 1e6, atol=0.5)
    assert np.allclose((t["last_chunk_time_us"] - arrival)[ok], e.e2e_s[:n][ok] * 1e6, atol=0.5)
    assert (t["first_chunk_time_us"][~ok] == 0).all() and (t["last_chunk_time_us"][~ok] == 0).all()
    assert set(t["streaming"]) == {"true"} and set(t["model"]) == {e.model.lower()}
    header = yaml.safe_load(exp.header.read_text())
    assert set(header) <= HEADER_KEYS and set(header["server"]) <= SERVER_KEYS
    assert header["trace_version"] == 2 and header["mode"] == "real" and header["warm_up_requests"] == 0
    assert header["server"]["tensor_parallel"] == e.tp and header["server"]["block_size"] == e.server.block_size
    cfg = json.loads(exp.config.read_text())
    back = ModelArch.from_model_config(
        {
            "num_layers": cfg["num_hidden_layers"],
            "hidden_dim": cfg["hidden_size"],
            "num_heads": cfg["num_attention_heads"],
            "num_kv_heads": cfg["num_key_value_heads"],
            "intermediate_dim": cfg["intermediate_size"],
            "vocab_size": cfg["vocab_size"],
            "num_local_experts": cfg.get("num_local_experts", 0),
            "num_experts_per_tok": cfg.get("num_experts_per_tok", 0),
        }
    )
    assert back == e.arch
    assert cfg["torch_dtype"] == "bfloat16" and cfg["hidden_act"] == "silu"
    assert cfg["max_position_embeddings"] >= int((e.input_tokens[:n] + e.output_tokens[:n]).max())
    # the command: every flag BLIS needs, the run finishes every request and drops none
    argv = exp.argv
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert argv[:2] == ["blis", "replay"] and exp.cmd_file.read_text() == exp.command + "\n"
    assert shlex.split(exp.command) == argv
    assert flags["--total-kv-blocks"] == str(e.server.kv_blocks) and flags["--tp"] == str(e.tp)
    assert flags["--block-size-in-tokens"] == str(e.server.block_size)
    assert flags["--max-num-seqs"] == str(e.server.max_num_seqs)
    assert flags["--max-num-batched-tokens"] == str(e.server.max_num_batched_tokens)
    mml = int(flags["--max-model-len"])
    assert (e.input_tokens[:n] < mml).all() and (e.input_tokens[:n] + e.output_tokens[:n] <= mml).all()
    assert int(flags["--horizon"]) > t["deadline_us"].max()
    assert flags["--results-path"] == str(exp.results.resolve()) and flags["--log"] == "error"
    for f in (
        "--trace-header",
        "--trace-data",
        "--model-config-folder",
        "--model",
        "--latency-model",
        "--hardware",
        "--hardware-config",
        "--defaults-filepath",
        "--seed",
    ):
        assert f in flags, f
    return t, flags


def pick(synthetic, kind: str):
    """A synthetic experiment's directory by what it has (names may change with the generator)."""
    es = synthetic.experiments
    e = {
        "moe": lambda: next(x for x in es if x.arch.num_experts),
        "failed": lambda: max(es, key=lambda x: x.n_failed),
        "dense": lambda: next(x for x in es if not x.arch.num_experts and not x.n_failed),
    }[kind]()
    return synthetic.directory / e.name


@pytest.mark.parametrize("kind", ["moe", "failed"])
def test_synthetic_experiment_parses_back(synthetic, kind, tmp_path):
    d = pick(synthetic, kind)
    e = load_experiment(d)
    assert e.arch.num_experts if kind == "moe" else e.n_failed
    exp = export_experiment_dir(d, tmp_path / "t")
    t, flags = check_export(exp, e)
    assert flags["--latency-model"] == "stepml-evolved" and flags["--hardware"] == "H100"
    assert flags["--defaults-filepath"] == "defaults.yaml" and flags["--hardware-config"] == "hardware_config.json"
    assert flags["--max-model-len"] == "4096"  # the server's (exp-config.yaml): nothing exceeds it
    if e.arch.num_experts:
        cfg = json.loads(exp.config.read_text())
        assert cfg["num_local_experts"] == e.arch.num_experts and cfg["num_experts_per_tok"] == e.arch.top_k
    if e.n_failed:
        ok = ~e.failed
        assert (t["deadline_us"][~ok] - t["arrival_time_us"][~ok] == np.round(e.e2e_s[~ok] * 1e6)).all()


def test_requests_window_and_max_model_len(synthetic, tmp_path):
    d = pick(synthetic, "dense")
    e = load_experiment(d)
    exp = export_blis_trace(e, tmp_path / "w", requests=25, server_max_model_len=300)
    t, flags = check_export(exp, e, n=25)
    need = int(max((e.input_tokens[:25] + e.output_tokens[:25]).max(), e.input_tokens[:25].max() + 1))
    assert int(flags["--max-model-len"]) == need > 300 and any("raised" in note for note in exp.notes)
    assert yaml.safe_load(exp.header.read_text())["server"]["max_model_len"] == 300  # the server's, as it ran
    assert int(flags["--horizon"]) == int((e.arrival_us[:25] + e.abort_after_us[:25]).max()) + 1_000_000


@pytest.mark.parametrize("name", [CODEGEN, REASONING])
def test_real_experiment_parses_back(real_data, name, tmp_path):
    e = load_experiment(real_data / name)
    exp = export_experiment_dir(real_data / name, tmp_path / "real")
    _, flags = check_export(exp, e)
    assert flags["--model"] == "meta-llama/llama-2-7b-hf" and flags["--total-kv-blocks"] == "7462"
    assert flags["--max-model-len"] == "4096"
    if name == REASONING:
        assert e.n_failed > 0


def blis_metrics(stdout: str) -> dict:
    m = re.search(r"=== Simulation Metrics ===\s*(\{.*?\n\})", stdout, re.S)
    assert m, stdout[-2000:]
    return json.loads(m.group(1))


def run_blis(exp, blis_build, latency_model="roofline"):
    argv = [str(blis_build / "blis")] + exp.argv[1:]
    argv[argv.index("--latency-model") + 1] = latency_model
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return blis_metrics(proc.stdout)


def test_blis_replays_the_exported_trace(synthetic, blis_build, tmp_path):
    d = pick(synthetic, "moe")
    e = load_experiment(d)
    exp = export_experiment_dir(d, tmp_path / "mx", blis_dir=blis_build, requests=120)
    flags = dict(zip(exp.argv[2::2], exp.argv[3::2]))
    assert flags["--defaults-filepath"] == str(blis_build.resolve() / "defaults.yaml")
    m = run_blis(exp, blis_build)
    assert m["injected_requests"] == 120 and m["completed_requests"] == 120
    assert m["dropped_unservable"] == 0 and m["still_queued"] == 0 and m["still_running"] == 0
    results = read_blis_results(exp.results)
    assert sorted(results) == list(range(120))
    raw = json.loads(exp.results.read_text())
    assert all(r["input_tokens"] == e.input_tokens[r["request_id"]] for r in raw)  # prefix + suffix = the prompt
    assert all(r["output_tokens"] == e.output_tokens[r["request_id"]] for r in raw)
    assert all(0 < ttft < e2e for ttft, e2e in results.values())


def test_blis_honours_the_client_timeouts(synthetic, blis_build, tmp_path):
    """deadline_us is absolute: requests given a 1 ms client timeout time out in BLIS and are absent
    from its results; the others complete."""
    e = load_experiment(pick(synthetic, "dense"))
    abort = e.abort_after_us.copy()
    short = np.zeros(e.n_requests, bool)
    short[10:40:3] = True
    abort[short] = 1000
    e = dataclasses.replace(e, abort_after_us=abort)
    exp = export_blis_trace(e, tmp_path / "to", blis_dir=blis_build, requests=40)
    m = run_blis(exp, blis_build)
    results = read_blis_results(exp.results)
    assert m["timed_out_requests"] == int(short[:40].sum()) and m["completed_requests"] == 40 - int(short[:40].sum())
    assert sorted(results) == [i for i in range(40) if not short[i]]


def test_cli_prints_the_command_and_writes_the_files(synthetic, tmp_path):
    d = pick(synthetic, "dense")
    tp = load_experiment(d).tp
    res = cli(
        "data",
        "export",
        "--blis-trace",
        d,
        "--out",
        tmp_path / "p",
        "--latency-model",
        "roofline",
        "--requests",
        50,
        "--seed",
        7,
    )
    assert res.exit_code == 0, res.output
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith("blis replay ") and line == (tmp_path / "p.cmd").read_text().strip()
    argv = shlex.split(line)
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert flags["--latency-model"] == "roofline" and flags["--seed"] == "7" and flags["--tp"] == str(tp)
    assert len(read_trace(tmp_path / "p.csv")["request_id"]) == 50
    assert (tmp_path / "p.yaml").is_file() and (tmp_path / "p.model" / "config.json").is_file()


def one_line_error(res, *texts):
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert all(t in lines[0] for t in texts), res.stderr
    assert "Traceback" not in res.output


def test_bad_input_is_one_line_and_writes_nothing(synthetic, tmp_path):
    d = pick(synthetic, "dense")
    out = tmp_path / "out"
    out.mkdir()
    one_line_error(cli("data", "export", "--blis-trace", tmp_path / "nope", "--out", out / "p"), "no such")
    one_line_error(cli("data", "export", "--blis-trace", out, "--out", out / "p"), "not an experiment")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "requests.json").write_text("{not json")
    (broken / "ground_truth.json").write_text("[]")
    one_line_error(cli("data", "export", "--blis-trace", broken, "--out", out / "p"), "broken", "malformed JSON")
    one_line_error(cli("data", "export", "--blis-trace", d, "--out", tmp_path / "missing" / "p"), "does not exist")
    one_line_error(
        cli("data", "export", "--blis-trace", d, "--out", out / "p", "--blis", tmp_path), "not a BLIS checkout"
    )
    assert list(out.iterdir()) == []
    # over an input: DIR/exp-config -> DIR/exp-config.yaml is the experiment's own file
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in d.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    before = {f.name: f.read_bytes() for f in copy.iterdir()}
    one_line_error(cli("data", "export", "--blis-trace", copy, "--out", copy / "exp-config"), "is an input")
    assert {f.name: f.read_bytes() for f in copy.iterdir()} == before


def test_read_blis_results_rejects_what_is_not_a_results_file(tmp_path):
    p = tmp_path / "r.json"
    for text, msg in [
        ("{", "malformed JSON"),
        ('{"a": 1}', "expected a JSON list"),
        ('[{"request_id": 1}]', "entry 0"),
        ('[{"request_id": 1, "ttft_us": 1, "e2e_us": 2}, {"request_id": 1, "ttft_us": 1, "e2e_us": 2}]', "twice"),
    ]:
        p.write_text(text)
        with pytest.raises(BlisTraceError, match=msg):
            read_blis_results(p)
    with pytest.raises(BlisTraceError, match="no such"):
        read_blis_results(tmp_path / "absent.json")
    p.write_text('[{"request_id": 3, "ttft_us": 10.5, "e2e_us": 99, "input_tokens": 5, "output_tokens": 2}]')
    assert read_blis_results(p) == {3: (10.5, 99.0)}
