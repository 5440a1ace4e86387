"""`evolve data import`: BLIS traces, inference-perf and OTel spans as one experiment in the
replay layout; round trips through `evolve data export --blis-trace`; bad input."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import yaml
from conftest import REAL_DATA, needs_real_data
from typer.testing import CliRunner

from stepml_evolve.evaluator.data.experiment_reader import load_experiment
from stepml_evolve.evaluator.data.experiments import ExperimentError
from stepml_evolve.evaluator.importers import DataImportError, import_experiment
from stepml_evolve.evaluator.importers.blis_trace_export import TRACE_COLUMNS, export_experiment_dir

LLAMA7 = "meta-llama/Llama-2-7b-hf"
DEPLOY = dict(hardware="H100", max_num_batched_tokens=2048, kv_blocks=5000)
OLD_22 = tuple(
    c for c in TRACE_COLUMNS if c not in ("text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio")
)


def cli(*args):
    from stepml_evolve.evolve.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


def check_json(data_dir) -> dict:
    res = cli("data", "check", "--data", data_dir, "--json")
    assert res.exit_code == 0, res.output
    exps = json.loads(res.stdout)["experiments"]
    assert len(exps) == 1
    return exps[0]


FIGURES = ("n_requests", "n_failed", "output_len", "split", "model", "tp", "moe", "hardware")


def assert_same_figures(a: dict, b: dict):
    for k in FIGURES:
        assert a[k] == b[k], k
    for k in ("e2e_mean_s", "ttft_mean_s"):  # the trace has µs resolution
        assert math.isclose(a["observed"][k], b["observed"][k], rel_tol=1e-6, abs_tol=1e-6), k


def assert_same_replay(e1, e2):
    """What the replay sees is the same (group numbers may be renamed): e2 imported from the trace
    of e1 is e1 as the trace states its prompts (Experiment.trace_view)."""
    e1, _ = e1.trace_view()
    for f in ("arrival_us", "input_tokens", "output_tokens", "failed", "abort_after_us", "split"):
        assert np.array_equal(getattr(e1, f), getattr(e2, f)), f
    assert e1.server == e2.server and e1.arch == e2.arch and e1.tp == e2.tp
    assert np.array_equal(e1.prefix_group >= 0, e2.prefix_group >= 0)
    pairs = set(zip(e1.prefix_group.tolist(), e2.prefix_group.tolist())) - {(-1, -1)}
    assert len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs})  # a bijection
    assert all(e1.group_tokens[a] == e2.group_tokens[b] for a, b in pairs)  # of groups of the same lengths
    ok = ~e1.failed
    assert np.allclose(e1.e2e_s, e2.e2e_s, atol=1e-6) and np.allclose(e1.ttft_s[ok], e2.ttft_s[ok], atol=1e-6)


def round_trip(exp_dir, tmp_path):
    tmp_path.mkdir(exist_ok=True)
    export_experiment_dir(exp_dir, tmp_path / "p")
    res = cli("data", "import", "--from", "blis-trace", tmp_path / "p.yaml", "--out", tmp_path / "back")
    assert res.exit_code == 0, res.output
    assert "measured at the client" in res.stdout
    assert_same_figures(check_json(exp_dir), check_json(tmp_path / "back"))
    e1, e2 = load_experiment(exp_dir), load_experiment(tmp_path / "back")
    assert_same_replay(e1, e2)
    assert e2.recorded_groups and e2.measurement == "client"
    return e1, e2


# ---- round trips ------------------------------------------------------------------------------


def test_export_then_import_gives_the_same_data_check_on_the_synthetic_sample(synthetic, tmp_path):
    for e in synthetic.experiments:
        e1, _ = round_trip(synthetic.directory / e.name, tmp_path / e.name)
        assert (e1.prefix_group >= 0).any()
    assert any(e.n_failed for e in synthetic.experiments)  # failed requests went through a round trip


REAL = ["20260217-155451-llama-2-7b-tp1-codegen", "20260217-170634-llama-2-7b-tp1-reasoning"]


@needs_real_data
@pytest.mark.parametrize("name", REAL)
def test_export_then_import_gives_the_same_data_check_on_real_runs(name, tmp_path):
    _, e2 = round_trip(REAL_DATA / name, tmp_path)
    if "reasoning" in name:
        assert e2.n_failed > 0


@needs_real_data
def test_export_then_import_gives_the_same_data_check_on_every_real_run(tmp_path):
    dirs = sorted(p for p in REAL_DATA.iterdir() if (p / "requests.json").is_file() and p.name not in REAL)
    assert dirs
    for d in dirs:
        export_experiment_dir(d, tmp_path / d.name)
        import_experiment("blis-trace", tmp_path / f"{d.name}.yaml", tmp_path / f"{d.name}.back")
        assert_same_figures(check_json(d), check_json(tmp_path / f"{d.name}.back"))


# ---- BLIS trace fixtures ------------------------------------------------------------------------


def blis_row(i, arrival, ttft_us, e2e_us, inp=200, out=50, status="ok", deadline=0, group="", plen=0, send=None):
    send = arrival if send is None else send
    ok = status == "ok"
    return {
        "request_id": i,
        "client_id": "c",
        "tenant_id": "",
        "slo_class": "",
        "session_id": "",
        "round_index": 0,
        "prefix_group": group,
        "prefix_length": plen,
        "streaming": "true",
        "input_tokens": inp,
        "output_tokens": out,
        "text_tokens": 0,
        "image_tokens": 0,
        "audio_tokens": 0,
        "video_tokens": 0,
        "reason_ratio": 0,
        "model": LLAMA7.lower(),
        "deadline_us": deadline,
        "server_input_tokens": inp + plen,
        "arrival_time_us": arrival,
        "send_time_us": send,
        "first_chunk_time_us": send + ttft_us if ok else 0,
        "last_chunk_time_us": send + e2e_us if ok else 0,
        "num_chunks": out if ok else 0,
        "status": status,
        "error_message": "",
        "finish_reason": "length" if ok else "",
        "vllm_priority": 0,
        "slo_target_us": 0,
        "x_request_id": f"uuid-{i}",
        "adapter": "",
        "think_time_us": 0,
    }


def default_rows():
    t0 = 1_700_000_000_000_000  # absolute µs, as blis observe writes
    return [
        blis_row(0, t0, 30_000, 1_000_000, deadline=t0 + 60_000_000),
        blis_row(1, t0 + 100_000, 40_000, 1_500_000, group="g1", plen=64, deadline=t0 + 60_100_000),
        blis_row(2, t0 + 200_000, 0, 0, status="timeout", deadline=t0 + 20_200_000),
        blis_row(3, t0 + 300_000, 20_000, 20_000, out=0, deadline=t0 + 60_300_000),  # zero output
        blis_row(4, t0 + 400_000, 35_000, 1_200_000, group="g1", plen=64, deadline=t0 + 60_400_000),
        blis_row(5, t0 + 500_000, 25_000, 900_000, group="g2", plen=64, deadline=t0 + 60_500_000),
    ]


def write_blis(tmp_path, rows=None, columns=TRACE_COLUMNS, header=None, name="t", deployment=True, server=True):
    rows = default_rows() if rows is None else rows
    h = {"trace_version": 2, "time_unit": "microseconds", "mode": "real", "warm_up_requests": 0}
    if server:
        h["server"] = {
            "type": "vllm",
            "model": LLAMA7,
            "tensor_parallel": 1,
            "max_num_seqs": 64,
            "block_size": 16,
            "max_model_len": 4096,
        }
    h.update(header or {})
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(h))
    with (tmp_path / f"{name}.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        for r in rows:
            w.writerow([r[c] for c in columns])
    if deployment:
        (tmp_path / f"{name}.deployment.yaml").write_text(yaml.safe_dump(DEPLOY))
    return tmp_path / f"{name}.yaml"


def check_blis_import(e):
    assert e.n_requests == 6 and e.n_failed == 1 and e.measurement == "client"
    assert list(e.arrival_us) == [0, 100_000, 200_000, 300_000, 400_000, 500_000]
    assert list(e.input_tokens) == [200, 264, 200, 200, 264, 264]  # prefix + suffix for a group
    assert list(e.prefix_group) == [-1, 0, -1, -1, 0, 1] and e.group_tokens == (64, 64) and e.recorded_groups
    assert e.abort_after_us[2] == 20_000_000 and e.abort_after_us[0] == 60_000_000  # deadline - arrival
    assert math.isclose(e.ttft_s[1], 0.04) and math.isclose(e.e2e_s[1], 1.5) and math.isclose(e.e2e_s[2], 20.0)
    assert e.output_tokens[3] == 1 and e.reported_output_tokens[3] == 0  # zero-output request replays one token
    assert e.server.max_num_seqs == 64 and e.server.kv_blocks == 5000 and e.tp == 1 and e.model == LLAMA7


def test_blis_trace_columns_are_read_by_name_optional_ones_included(tmp_path):
    cols = list(TRACE_COLUMNS)
    cols.insert(cols.index("slo_class") + 1, "vllm_priority")
    cols.insert(cols.index("deadline_us") + 1, "slo_target_us")
    cols += ["x_request_id", "adapter", "think_time_us"]
    src = write_blis(tmp_path, columns=cols)
    res = cli("data", "import", "--from", "blis-trace", src, "--out", tmp_path / "exp")
    assert res.exit_code == 0, res.output
    check_blis_import(load_experiment(tmp_path / "exp"))
    meta = json.loads((tmp_path / "exp" / "requests.json").read_text())
    assert meta["measurement"] == "client" and meta["config"]["client_timeout_s"] == 60.0
    assert check_json(tmp_path / "exp")["measurement"] == "client"


def test_an_older_22_column_trace_and_trace_version_3_import(tmp_path):
    src = write_blis(tmp_path, columns=OLD_22, header={"trace_version": 3, "goodput_slo_targets": {}})
    assert len(OLD_22) == 22
    import_experiment("blis-trace", src, tmp_path / "exp")
    check_blis_import(load_experiment(tmp_path / "exp"))


def test_trace_data_flag_and_send_time(tmp_path):
    rows = default_rows()
    rows[0]["send_time_us"] = rows[0]["arrival_time_us"] + 5_000  # sent 5 ms after its scheduled arrival
    rows[0]["first_chunk_time_us"] += 5_000
    rows[0]["last_chunk_time_us"] += 5_000
    src = write_blis(tmp_path, rows=rows, name="x")
    (tmp_path / "x.csv").rename(tmp_path / "data.csv")
    with pytest.raises(DataImportError, match="no such trace data"):
        import_experiment("blis-trace", src, tmp_path / "exp")
    import_experiment("blis-trace", src, tmp_path / "exp", trace_data=tmp_path / "data.csv")
    e = load_experiment(tmp_path / "exp")
    assert math.isclose(e.ttft_s[0], 0.03) and math.isclose(e.e2e_s[0], 1.0)  # from the send time


def test_flags_override_and_deployment_yaml_in_directory(tmp_path):
    src = write_blis(tmp_path, deployment=False, server=False)
    (tmp_path / "deployment.yaml").write_text(
        yaml.safe_dump({**DEPLOY, "model": LLAMA7.upper(), "tp": 2, "max_num_seqs": 32, "block_size": 16})
    )
    import_experiment("blis-trace", src, tmp_path / "exp", tp=1, kv_blocks=777)
    e = load_experiment(tmp_path / "exp")
    assert e.tp == 1 and e.server.kv_blocks == 777 and e.server.max_num_seqs == 32 and e.model == LLAMA7


def test_missing_deployment_fields_are_listed_and_nothing_written(tmp_path):
    src = write_blis(tmp_path, deployment=False, server=False)
    res = cli("data", "import", "--from", "blis-trace", src, "--out", tmp_path / "exp", "--hardware", "A100-80GB")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("error:") and "6 deployment field(s)" in lines[0] and "t.deployment.yaml" in lines[0]
    flags = [ln.split()[0] for ln in lines[1:]]
    assert flags == ["--model", "--tp", "--max-num-seqs", "--max-num-batched-tokens", "--kv-blocks", "--block-size"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.yaml"]


def test_unknown_model_needs_model_config(tmp_path):
    src = write_blis(tmp_path)
    res = cli("data", "import", "--from", "blis-trace", src, "--out", tmp_path / "exp", "--model", "acme/tiny-1b")
    assert res.exit_code == 2 and "--model-config FILE" in res.stderr and "acme/tiny-1b is not built in" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 2  # the headline and exactly one missing field
    assert not (tmp_path / "exp").exists()
    cfg = {
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 1024,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    res = cli(
        "data",
        "import",
        "--from",
        "blis-trace",
        src,
        "--out",
        tmp_path / "exp",
        "--model",
        "acme/tiny-1b",
        "--model-config",
        tmp_path / "config.json",
    )
    assert res.exit_code == 0, res.output
    e = load_experiment(tmp_path / "exp")
    assert (e.arch.layers, e.arch.hidden, e.arch.kv_heads, e.arch.vocab) == (
        4,
        512,
        2,
        1000,
    ) and e.model == "acme/tiny-1b"


def one_line_error(res, *texts):
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert all(t in lines[0] for t in texts), res.stderr


def mutate(i, **kw):
    rows = default_rows()
    rows[i].update(kw)
    return rows


BAD_BLIS = [
    ("malformed row", dict(rows=mutate(2, input_tokens="12x")), ("t.csv", "row 3", "input_tokens '12x'")),
    (
        "missing column",
        dict(columns=[c for c in TRACE_COLUMNS if c != "first_chunk_time_us"]),
        ("t.csv", "lacks the column first_chunk_time_us"),
    ),
    ("mode generated", dict(header={"mode": "generated"}), ("t.yaml", "'generated'", "not 'real'")),
    ("mode replayed", dict(header={"mode": "replayed"}), ("t.yaml", "'replayed'")),
    ("trace version 4", dict(header={"trace_version": 4}), ("t.yaml", "trace_version 4")),
    (
        "last before first",
        dict(rows=mutate(1, last_chunk_time_us=default_rows()[1]["first_chunk_time_us"] - 1)),
        ("t.csv", "row 2", "last_chunk_time_us", "precedes first_chunk_time_us"),
    ),
    (
        "first before send",
        dict(rows=mutate(4, first_chunk_time_us=default_rows()[4]["send_time_us"] - 1)),
        ("t.csv", "row 5", "precedes the send time"),
    ),
    (
        "no success",
        dict(rows=[blis_row(i, 1000 + i, 0, 0, status="timeout", deadline=10**7) for i in range(3)]),
        ("t.csv", "no successful request"),
    ),
    ("bad status", dict(rows=mutate(0, status="weird")), ("row 1", "status 'weird'")),
    ("short row", dict(rows=mutate(0, finish_reason="x")), None),  # a valid value: must import
    ("failed without times", dict(rows=mutate(2, deadline_us=0)), ("row 3", "how long it lasted is unknown")),
    (
        "one group, two prefix lengths",
        dict(rows=mutate(4, prefix_length=32)),
        ("t.csv", "prefix group 'g1' has prefix_length 32, an earlier one 64", "one group, one shared prefix"),
    ),
    ("groups of different lengths", dict(rows=mutate(5, prefix_length=32)), None),  # each group its own length
]


@pytest.mark.parametrize("case,kw,texts", BAD_BLIS, ids=[c[0] for c in BAD_BLIS])
def test_bad_blis_trace_is_one_line_and_writes_nothing(tmp_path, case, kw, texts):
    src = write_blis(tmp_path, **kw)
    before = sorted(p.name for p in tmp_path.iterdir())
    res = cli("data", "import", "--from", "blis-trace", src, "--out", tmp_path / "exp")
    if texts is None:
        assert res.exit_code == 0, res.output
        return
    one_line_error(res, *texts)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no directory, no temporary left over


def test_truncated_row_and_bad_out_dir(tmp_path):
    src = write_blis(tmp_path)
    with (tmp_path / "t.csv").open("a") as fh:
        fh.write("6,c,,,\n")
    one_line_error(
        cli("data", "import", "--from", "blis-trace", src, "--out", tmp_path / "exp"), "t.csv", "row 7", "has 5 columns"
    )
    write_blis(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    one_line_error(
        cli("data", "import", "--from", "blis-trace", src, "--out", tmp_path / "full"), "not an empty directory"
    )
    one_line_error(
        cli("data", "import", "--from", "blis-trace", src, "--out", tmp_path / "no" / "exp"), "does not exist"
    )
    (tmp_path / "empty").mkdir()
    assert cli("data", "import", "--from", "blis-trace", src, "--out", tmp_path / "empty").exit_code == 0
    assert (tmp_path / "empty" / "requests.json").is_file()


# ---- the loader: recorded groups --------------------------------------------------------------


def test_loader_keeps_each_recorded_group_s_length_and_refuses_inconsistent_ones(tmp_path):
    import_experiment("blis-trace", write_blis(tmp_path), tmp_path / "exp")
    p = tmp_path / "exp" / "requests.json"
    meta = json.loads(p.read_text())
    grouped = [r for r in meta["requests"] if r["prefix_group"]]  # g1, g1, g2
    grouped[2]["prefix_length"] = 32  # g2 has its own length
    p.write_text(json.dumps(meta))
    e = load_experiment(tmp_path / "exp")
    assert e.group_tokens == (64, 32) and e.prompt_reuse.model == "recorded"
    grouped[1]["prefix_length"] = 32  # g1's second request: two lengths in one group
    p.write_text(json.dumps(meta))
    with pytest.raises(ExperimentError, match="request 4 has prefix_length 32 but group 'g1' started with 64"):
        load_experiment(tmp_path / "exp")
    grouped[0]["prefix_length"] = grouped[1]["prefix_length"] = 300  # longer than the prompts (264 tokens)
    p.write_text(json.dumps(meta))
    with pytest.raises(
        ExperimentError, match="request 1 has prefix_length 300 of group 'g1' but only 264 input tokens"
    ):
        load_experiment(tmp_path / "exp")
    grouped[0]["prefix_length"] = grouped[1]["prefix_length"] = 64
    meta["measurement"] = "proxy"
    p.write_text(json.dumps(meta))
    with pytest.raises(ExperimentError, match="measurement must be one of client, server"):
        load_experiment(tmp_path / "exp")


def test_existing_data_defaults_to_client_and_round_robin(synthetic):
    e = synthetic.experiments[0]
    assert e.measurement == "client" and not e.recorded_groups


# ---- inference-perf ---------------------------------------------------------------------------


def ip_request(start, ttft, e2e, inp=300, out=4, error=None, nested=False):
    times = [start + ttft + k * (e2e - ttft) / max(out - 1, 1) for k in range(out)] if not error else []
    if nested:
        info = {
            "request_metrics": {"text": {"input_tokens": inp}},
            "response_metrics": {"output_tokens": out if not error else 0, "output_token_times": times},
        }
    else:
        info = {"input_tokens": inp, "output_tokens": out if not error else 0, "output_token_times": times}
    return {
        "stage_id": 0,
        "scheduled_time": start,
        "start_time": start,
        "end_time": start + e2e,
        "request_data": "{}",
        "info": info,
        "error": error,
    }


def ip_requests():
    return [
        ip_request(1000.0, 0.05, 2.0),
        ip_request(1000.5, 0.08, 2.5, nested=True),
        ip_request(1001.0, 0.0, 300.0, inp=0, error={"error_type": "TimeoutError", "error_msg": "timeout"}),
        ip_request(1001.5, 0.02, 0.02, out=0),
    ]


def test_inference_perf_lifecycle_metrics_import_as_a_client_measured_experiment(tmp_path):
    src = tmp_path / "per_request_lifecycle_metrics.json"
    src.write_text(json.dumps(ip_requests()))
    res = cli(
        "data",
        "import",
        "--from",
        "inference-perf",
        src,
        "--out",
        tmp_path / "exp",
        "--model",
        LLAMA7,
        "--hardware",
        "H100",
        "--tp",
        1,
        "--max-num-seqs",
        128,
        "--max-num-batched-tokens",
        2048,
        "--kv-blocks",
        7000,
        "--block-size",
        16,
    )
    assert res.exit_code == 0, res.output
    e = load_experiment(tmp_path / "exp")
    assert e.n_requests == 4 and e.n_failed == 1 and e.measurement == "client"
    assert list(e.arrival_us) == [0, 500_000, 1_000_000, 1_500_000]
    assert math.isclose(e.ttft_s[1], 0.08, abs_tol=1e-9) and math.isclose(e.e2e_s[1], 2.5, abs_tol=1e-9)
    assert math.isclose(e.e2e_s[2], 300.0) and e.input_tokens[2] == 300  # imputed from the successful ones
    assert list(e.reported_output_tokens) == [4, 4, 0, 0] and e.output_tokens[3] == 1
    assert check_json(tmp_path / "exp")["measurement"] == "client"


@pytest.mark.parametrize(
    "edit,texts",
    [
        (lambda rs: rs[1].pop("end_time"), ("request 2", "no end_time")),
        (lambda rs: rs[0].update(end_time=999.0), ("request 1", "precedes start_time")),
        (lambda rs: rs[0]["info"].update(output_token_times=[999.0, 1000.5]), ("request 1", "precedes start_time")),
        (lambda rs: rs[0]["info"].update(output_token_times=[]), ("request 1", "no output_token_times")),
        (lambda rs: [r.update(error={"error_type": "x", "error_msg": "y"}) for r in rs], ("no successful request",)),
    ],
)
def test_bad_inference_perf_files_are_one_line_and_write_nothing(tmp_path, edit, texts):
    rs = ip_requests()
    edit(rs)
    src = tmp_path / "m.json"
    src.write_text(json.dumps(rs))
    (tmp_path / "m.deployment.yaml").write_text(
        yaml.safe_dump({**DEPLOY, "model": LLAMA7, "tp": 1, "max_num_seqs": 8, "block_size": 16})
    )
    one_line_error(cli("data", "import", "--from", "inference-perf", src, "--out", tmp_path / "exp"), "m.json", *texts)
    assert not (tmp_path / "exp").exists()


# ---- OTel -------------------------------------------------------------------------------------


def span(rid, start_ns, ttft, e2e, prompt=500, completion=20, queue=0.01, error=False, name="llm_request"):
    attrs = [
        ("gen_ai.request.id", {"stringValue": rid}),
        ("gen_ai.usage.prompt_tokens", {"intValue": str(prompt)}),
        ("gen_ai.usage.completion_tokens", {"intValue": completion}),
        ("gen_ai.latency.e2e", {"doubleValue": e2e}),
        ("gen_ai.latency.time_in_queue", {"doubleValue": queue}),
    ]
    if ttft is not None:
        attrs.append(("gen_ai.latency.time_to_first_token", {"doubleValue": ttft}))
    return {
        "traceId": "ab",
        "spanId": rid,
        "name": name,
        "kind": 2,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(start_ns + int(e2e * 1e9)),
        "status": {"code": 2 if error else 0},
        "attributes": [{"key": k, "value": v} for k, v in attrs],
    }


def otel_lines(spans_per_line):
    return (
        "\n".join(
            json.dumps(
                {
                    "resourceSpans": [
                        {
                            "resource": {"attributes": []},
                            "scopeSpans": [{"scope": {"name": "vllm.llm_engine"}, "spans": spans}],
                        }
                    ]
                }
            )
            for spans in spans_per_line
        )
        + "\n"
    )


def test_otel_spans_import_as_a_server_measured_experiment(tmp_path):
    t0 = 1_700_000_000_000_000_000
    src = tmp_path / "spans.jsonl"
    src.write_text(
        otel_lines(
            [
                [span("a", t0, 0.1, 3.0), span("x", t0, None, 1.0, name="other")],
                [span("b", t0 + 250_000_000, 0.2, 2.0), span("c", t0 + 500_000_000, None, 5.0, error=True)],
            ]
        )
    )
    (tmp_path / "deployment.yaml").write_text(
        yaml.safe_dump(
            {**DEPLOY, "model": "mistralai/mixtral-8x7b-v0.1", "tp": 2, "max_num_seqs": 128, "block_size": 16}
        )
    )
    res = cli("data", "import", "--from", "otel", src, "--out", tmp_path / "exp")
    assert res.exit_code == 0, res.output
    assert "measured at the server" in res.stdout
    e = load_experiment(tmp_path / "exp")
    assert e.measurement == "server" and e.n_requests == 3 and e.n_failed == 1 and e.arch.moe
    assert list(e.arrival_us) == [0, 250_000, 500_000] and list(e.input_tokens) == [500, 500, 500]
    assert math.isclose(e.ttft_s[1], 0.2) and math.isclose(e.e2e_s[2], 5.0)
    j = check_json(tmp_path / "exp")
    assert j["measurement"] == "server"
    table = cli("data", "check", "--data", tmp_path / "exp")
    assert "measured at" in table.stdout and "server" in table.stdout


@pytest.mark.parametrize(
    "text,texts",
    [
        ("{not json\n", ("line 1", "malformed JSON")),
        (json.dumps({"spans": []}) + "\n", ("line 1", "no resourceSpans")),
        (otel_lines([[span("a", 10**18, 0.5, 0.2)]]), ("request a", "greater than")),
        (otel_lines([[span("a", 10**18, 0.1, 1.0, prompt=-1)]]), ("request a", "gen_ai.usage.prompt_tokens")),
        (otel_lines([[span("a", 10**18, 0.1, 1.0, name="llm_core")]]), ("no llm_request spans",)),
    ],
)
def test_bad_otel_spans_are_one_line_and_write_nothing(tmp_path, text, texts):
    src = tmp_path / "s.jsonl"
    src.write_text(text)
    (tmp_path / "deployment.yaml").write_text(
        yaml.safe_dump({**DEPLOY, "model": LLAMA7, "tp": 1, "max_num_seqs": 8, "block_size": 16})
    )
    one_line_error(cli("data", "import", "--from", "otel", src, "--out", tmp_path / "exp"), "s.jsonl", *texts)
    assert not (tmp_path / "exp").exists()
