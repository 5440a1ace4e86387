"""An experiment as a BLIS trace v2, so `blis replay` and `blis calibrate` run on exactly the
requests the tool fits on (`evolve data export --blis-trace DIR --out PREFIX`).

Writes PREFIX.yaml (trace header), PREFIX.csv (one row per request, arrival order, request_id =
index), PREFIX.model/config.json (the architecture as a Hugging Face config for
`--model-config-folder`) and PREFIX.cmd (the `blis replay` command line, which BLIS answers with
PREFIX.results.json; `read_blis_results` reads that file back), and PREFIX.deployment.yaml (what
the trace does not record: hardware, max_num_batched_tokens, KV blocks and the model config, so
`evolve data import --from blis-trace PREFIX.yaml` gives the experiment back).

Format decisions (BLIS snapshot sim/workload/tracev2.go, replay.go, calibrate.go):
  * arrival_time_us = the experiment's arrival_us (µs from the first request) and send_time_us the
    same value: replay injects at send_time_us when it is > 0 (else at arrival), and calibrate
    measures the real TTFT/E2E from send_time_us, so both must be the arrival.
  * deadline_us = arrival + abort_after_us (absolute): a failed request is aborted at its observed
    E2E, the others at the client limit, as the tool's replay does.
  * prompt: the sharing a trace can state (Experiment.trace_view, prompt_reuse.trace_sharing):
    a request whose prompt was sent more than once gets prefix_group "p<prompt>" with
    prefix_length = its whole prompt and input_tokens 0 (every send is the same tokens); another
    request in a shared-prefix group gets "sp<g>", prefix_length = the group's prefix and
    input_tokens = its input minus the prefix (BLIS prepends the group's prefix, so its prompt
    length is the tool's input_tokens); otherwise no group and the whole input.
    server_input_tokens = the whole prompt (prefix included, as a server reports prompt_tokens):
    replay ignores it for a grouped request and it equals input_tokens otherwise, and calibrate
    compares it with the simulated prompt length (with 0 it would compare the suffix and count
    every grouped request as a token mismatch).
  * observed timings: successful requests have status "ok", first_chunk_time_us = arrival + TTFT,
    last_chunk_time_us = arrival + E2E, num_chunks = output tokens (streaming, one chunk a
    token). Failed requests are client timeouts: status "timeout" (what `blis observe` writes for
    one), no chunk times (0: no first token was seen), num_chunks 0.
  * model column = the model id lower-cased, as BLIS lower-cases --model (a request whose model
    differs from the instance's is not routable).
  * --max-model-len: the server's (exp-config.yaml) raised if needed so that BLIS drops nothing
    (it drops input >= max_model_len or input + output > max_model_len).
  * --horizon: the last deadline plus 1 s, so every request completes or times out (BLIS schedules
    a timeout only for a deadline within the horizon; its default, 2 x last arrival, cuts the tail).
"""

from __future__ import annotations

import csv
import io
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from stepml_evolve.evaluator.data.experiment_reader import load_experiment
from stepml_evolve.evaluator.data.experiments import Experiment, ExperimentError, LoadOptions
from stepml_evolve.evaluator.data.prompt_reuse import DEFAULT_POLICY
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.outputs import OutputError, check_outputs, write_atomic
from stepml_evolve.evaluator.readers import CONFIG_BYTES, FileProblem, file_text, parse_yaml, read_json

DEFAULT_LATENCY_MODEL = "stepml-evolved"
DEFAULT_SEED = 42
HORIZON_MARGIN_US = 1_000_000
# the tool's hardware name -> BLIS's (hardware_config.json keys)
BLIS_HARDWARE = {"H100": "H100", "A100-80GB": "A100-80"}
# sim/workload/tracev2.go traceV2Columns, in order (parsed by position)
TRACE_COLUMNS = (
    "request_id",
    "client_id",
    "tenant_id",
    "slo_class",
    "session_id",
    "round_index",
    "prefix_group",
    "prefix_length",
    "streaming",
    "input_tokens",
    "output_tokens",
    "text_tokens",
    "image_tokens",
    "audio_tokens",
    "video_tokens",
    "reason_ratio",
    "model",
    "deadline_us",
    "server_input_tokens",
    "arrival_time_us",
    "send_time_us",
    "first_chunk_time_us",
    "last_chunk_time_us",
    "num_chunks",
    "status",
    "error_message",
    "finish_reason",
)
STATUS_OK, STATUS_TIMEOUT = "ok", "timeout"


class BlisTraceError(UserError):
    """Bad input to the export (experiment, output prefix, BLIS checkout) or a bad results file."""


@dataclass(frozen=True)
class Export:
    """What an export wrote and the command that replays it."""

    header: Path  # PREFIX.yaml
    data: Path  # PREFIX.csv
    model_dir: Path  # PREFIX.model (holds config.json)
    config: Path  # PREFIX.model/config.json
    cmd_file: Path  # PREFIX.cmd
    deployment: Path  # PREFIX.deployment.yaml
    results: Path  # PREFIX.results.json, written by `blis replay`
    argv: list[str]  # the blis replay command
    n_requests: int
    max_model_len: int
    horizon_us: int
    notes: list[str] = field(default_factory=list)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def output_paths(prefix: str | Path) -> dict[str, Path]:
    p = Path(prefix)
    name = p.name
    return {
        "header": p.with_name(f"{name}.yaml"),
        "data": p.with_name(f"{name}.csv"),
        "model_dir": p.with_name(f"{name}.model"),
        "config": p.with_name(f"{name}.model") / "config.json",
        "cmd_file": p.with_name(f"{name}.cmd"),
        "results": p.with_name(f"{name}.results.json"),
        "deployment": p.with_name(f"{name}.deployment.yaml"),
    }


def check_prefix(prefix: str | Path, inputs: list[Path] = ()) -> dict[str, Path]:
    """The output paths of PREFIX, after checking that each can be written (its directory exists,
    it is not a directory) and none is an input; a problem is a one-line OutputError."""
    if not Path(prefix).name or Path(prefix).name in (".", ".."):
        raise OutputError(f"{prefix}: give a file prefix (PREFIX.yaml, PREFIX.csv, ... are written), not a directory")
    paths = output_paths(prefix)
    check_outputs([paths["header"], paths["data"], paths["cmd_file"], paths["results"], paths["deployment"]], inputs)
    model_dir, protected = paths["model_dir"], {Path(p).resolve() for p in inputs}
    if model_dir.exists() and not model_dir.is_dir():
        raise OutputError(f"{model_dir}: exists and is not a directory (it would hold config.json)")
    if model_dir.resolve() in protected or paths["config"].resolve() in protected:
        raise OutputError(f"{paths['config']}: is an input of this command; choose another output prefix")
    if paths["config"].is_dir():
        raise OutputError(f"{paths['config']}: is a directory; choose another output prefix")
    return paths


def blis_hardware(experiment: Experiment) -> str:
    name = experiment.hardware.name
    if name not in BLIS_HARDWARE:
        raise BlisTraceError(f"{experiment.name}: hardware {name} has no BLIS name (known: {', '.join(BLIS_HARDWARE)})")
    return BLIS_HARDWARE[name]


def hf_config(experiment: Experiment, max_position_embeddings: int) -> dict:
    """The architecture as the Hugging Face config.json keys BLIS reads (sim/latency/config.go)."""
    a = experiment.arch
    moe = a.num_experts > 0
    cfg = {
        "architectures": ["MixtralForCausalLM" if moe else "LlamaForCausalLM"],
        "model_type": "mixtral" if moe else "llama",
        "num_hidden_layers": a.layers,
        "hidden_size": a.hidden,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "intermediate_size": a.ffn,
        "vocab_size": a.vocab,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": int(max_position_embeddings),
        "hidden_act": "silu",
    }
    if moe:
        cfg["num_local_experts"] = a.num_experts
        cfg["num_experts_per_tok"] = a.top_k
    return cfg


def server_extras(exp_dir: str | Path) -> dict:
    """max_model_len and gpu_memory_utilization from the experiment's exp-config.yaml (vLLM's
    arguments), where present and well-formed; {} otherwise."""
    p = Path(exp_dir) / "exp-config.yaml"
    try:
        cfg = parse_yaml(file_text(p, CONFIG_BYTES)) if p.exists() else None
    except FileProblem:
        return {}
    if not isinstance(cfg, dict):
        return {}
    out = {}
    v = cfg.get("max_model_len")
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        out["max_model_len"] = v
    v = cfg.get("gpu_memory_utilization")
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1:
        out["gpu_memory_utilization"] = float(v)
    return out


def _rows(e: Experiment, names: list[str], n: int, model: str) -> list[list]:
    """The CSV rows of `e` as its trace view (groups named by `names`)."""
    arrival = e.arrival_us[:n].astype(np.int64)
    deadline = arrival + e.abort_after_us[:n].astype(np.int64)
    groups = e.prefix_group[:n]
    inputs, outputs = e.input_tokens[:n], e.output_tokens[:n]
    rows = []
    for i in range(n):
        arr, inp, out = int(arrival[i]), int(inputs[i]), int(outputs[i])
        g = int(groups[i])
        if g >= 0:
            group, plen = names[g], int(e.group_tokens[g])
            suffix = inp - plen
        else:
            group, plen, suffix = "", 0, inp
        if e.failed[i]:
            first = last = chunks = 0
            status, message = STATUS_TIMEOUT, f"client timeout after {e.e2e_s[i]:.3f} s"
        else:
            first = arr + int(round(e.ttft_s[i] * 1e6))
            last = arr + int(round(e.e2e_s[i] * 1e6))
            chunks, status, message = out, STATUS_OK, ""
        rows.append(
            [
                i,
                "",
                "",
                "",
                "",
                0,
                group,
                plen,
                "true",
                suffix,
                out,
                0,
                0,
                0,
                0,
                0,
                model,
                int(deadline[i]),
                inp,
                arr,
                arr,
                first,
                last,
                chunks,
                status,
                message,
                "",
            ]
        )
    return rows


def _check_experiment(e: Experiment, n: int) -> None:
    """What BLIS would reject or misread, as one line (the loader guarantees most of it)."""

    def bad(problem):
        raise BlisTraceError(f"{e.name}: {problem}; cannot export as a BLIS trace")

    if (e.input_tokens[:n] < 1).any() or (e.output_tokens[:n] < 1).any():
        bad("a request has no input or output tokens")
    if (e.arrival_us[:n] < 0).any() or (np.diff(e.arrival_us[:n]) < 0).any():
        bad("arrivals are negative or not in order")
    if (e.abort_after_us[:n] <= 0).any():
        bad("a request has no positive client timeout")
    groups = e.prefix_group[:n]
    lengths = np.array(e.group_tokens + (0,), dtype=np.int64)[groups]
    if ((groups >= 0) & ((lengths <= 0) | (e.input_tokens[:n] < lengths))).any():
        bad("a request in a shared-prompt group is shorter than the shared prompt")
    ok = ~e.failed[:n]
    if not (np.isfinite(e.ttft_s[:n][ok]).all() and np.isfinite(e.e2e_s[:n][ok]).all()):
        bad("a successful request lacks its observed TTFT or E2E")


def export_blis_trace(
    experiment: Experiment,
    prefix: str | Path,
    *,
    blis_dir: str | Path | None = None,
    latency_model: str = DEFAULT_LATENCY_MODEL,
    seed: int = DEFAULT_SEED,
    requests: int | None = None,
    server_max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    inputs: list[Path] = (),
    binary: str = "blis",
) -> Export:
    """Write the experiment (its first `requests` requests, or all) as a BLIS trace v2 at PREFIX
    and return the paths and the `blis replay` argv. Every check runs before anything is written;
    a bad prefix (missing directory, over an input file) is a one-line OutputError.

    blis_dir: a BLIS checkout for --defaults-filepath/--hardware-config (default: relative paths,
    so the command runs from a checkout). binary: argv[0] (the line begins `blis replay`)."""
    e = experiment
    n = e.n_requests if requests is None else min(int(requests), e.n_requests)
    if n < 1:
        raise BlisTraceError(f"--requests must be at least 1, got {requests}")
    if not latency_model or any(c.isspace() for c in latency_model):
        raise BlisTraceError(f"--latency-model: not a backend name: {latency_model!r}")
    paths = check_prefix(prefix, inputs)
    model_dir = paths["model_dir"]
    if blis_dir is not None:
        bd = Path(blis_dir)
        missing = [f for f in ("defaults.yaml", "hardware_config.json") if not (bd / f).is_file()]
        if missing:
            raise BlisTraceError(f"--blis {bd}: not a BLIS checkout (no {' or '.join(missing)})")
        defaults, hw_config = str(bd.resolve() / "defaults.yaml"), str(bd.resolve() / "hardware_config.json")
    else:
        defaults, hw_config = "defaults.yaml", "hardware_config.json"
    hardware = blis_hardware(e)
    e, names = e.trace_view()
    _check_experiment(e, n)

    notes = []
    prompt = e.input_tokens[:n].astype(np.int64)
    total = prompt + e.output_tokens[:n].astype(np.int64)
    needed = int(max(total.max(), prompt.max() + 1))
    max_model_len = max(int(server_max_model_len or 0), needed)
    if server_max_model_len and max_model_len > server_max_model_len:
        notes.append(
            f"--max-model-len raised from the server's {server_max_model_len} to {max_model_len} "
            "so that BLIS drops no request"
        )
    kv_tokens = int(e.server.kv_blocks) * int(e.server.block_size)
    if max_model_len > kv_tokens:
        notes.append(
            f"--max-model-len {max_model_len} exceeds the KV cache ({kv_tokens} tokens): BLIS's roofline and "
            "trained-physics backends cap it there and may drop the longest requests"
        )
    deadlines = e.arrival_us[:n].astype(np.int64) + e.abort_after_us[:n].astype(np.int64)
    horizon = int(deadlines.max()) + HORIZON_MARGIN_US
    model = e.model.lower()

    header = {
        "trace_version": 2,
        "time_unit": "microseconds",
        "mode": "real",
        "warm_up_requests": 0,
        "server": {
            "type": "vllm",
            "model": e.model,
            "tensor_parallel": int(e.tp),
            "max_num_seqs": int(e.server.max_num_seqs),
            "block_size": int(e.server.block_size),
            "max_model_len": int(server_max_model_len or max_model_len),
        },
    }
    if gpu_memory_utilization is not None:
        header["server"]["gpu_memory_utilization"] = float(gpu_memory_utilization)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(TRACE_COLUMNS)
    w.writerows(_rows(e, names, n, model))

    ab = {k: str(v.resolve()) for k, v in paths.items()}
    argv = [
        binary,
        "replay",
        "--trace-header",
        ab["header"],
        "--trace-data",
        ab["data"],
        "--model",
        model,
        "--latency-model",
        latency_model,
        "--hardware",
        hardware,
        "--tp",
        str(int(e.tp)),
        "--model-config-folder",
        ab["model_dir"],
        "--hardware-config",
        hw_config,
        "--defaults-filepath",
        defaults,
        "--total-kv-blocks",
        str(int(e.server.kv_blocks)),
        "--block-size-in-tokens",
        str(int(e.server.block_size)),
        "--max-num-seqs",
        str(int(e.server.max_num_seqs)),
        "--max-num-batched-tokens",
        str(int(e.server.max_num_batched_tokens)),
        "--max-model-len",
        str(max_model_len),
        "--horizon",
        str(horizon),
        "--seed",
        str(int(seed)),
        "--log",
        "error",
        "--results-path",
        ab["results"],
    ]
    if n < e.n_requests:
        notes.append(f"trace cut to the first {n} of {e.n_requests} requests")

    model_dir.mkdir(exist_ok=True)
    write_atomic(paths["config"], json.dumps(hf_config(e, max_model_len), indent=2) + "\n")
    write_atomic(paths["data"], buf.getvalue())
    write_atomic(paths["header"], yaml.safe_dump(header, sort_keys=False))
    write_atomic(paths["cmd_file"], shlex.join(argv) + "\n")
    deployment = {
        "hardware": e.hardware.name,
        "max_num_batched_tokens": int(e.server.max_num_batched_tokens),
        "kv_blocks": int(e.server.kv_blocks),
        "model_config": f"{model_dir.name}/config.json",
    }
    write_atomic(paths["deployment"], yaml.safe_dump(deployment, sort_keys=False))
    return Export(
        header=paths["header"],
        data=paths["data"],
        model_dir=model_dir,
        config=paths["config"],
        cmd_file=paths["cmd_file"],
        deployment=paths["deployment"],
        results=paths["results"],
        argv=argv,
        n_requests=n,
        max_model_len=max_model_len,
        horizon_us=horizon,
        notes=notes,
    )


def load_for_export(exp_dir: str | Path, output_len: str = "profile", prompt_reuse: str = DEFAULT_POLICY) -> Experiment:
    """One experiment directory, as the tool loads it; any problem is one line naming it."""
    d = Path(exp_dir)
    if not d.is_dir():
        raise BlisTraceError(f"--blis-trace {d}: no such experiment directory")
    if not (d / "requests.json").is_file():
        raise BlisTraceError(f"--blis-trace {d}: not an experiment directory (no requests.json)")
    try:
        return load_experiment(d, LoadOptions(output_len=output_len, prompt_reuse=prompt_reuse))
    except ExperimentError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as ex:
        text = str(ex).splitlines()[0][:200] if str(ex) else ""
        raise ExperimentError(d.name, f"unexpected content ({type(ex).__name__}: {text})") from None


def export_experiment_dir(
    exp_dir: str | Path,
    prefix: str | Path,
    *,
    output_len: str = "profile",
    prompt_reuse: str = DEFAULT_POLICY,
    experiment: Experiment | None = None,
    **kwargs,
) -> Export:
    """`evolve data export`: load the experiment at exp_dir (unless the caller has: `experiment`)
    and export it (see export_blis_trace); the experiment's own files are never overwritten."""
    d = Path(exp_dir)
    if not d.is_dir():
        raise BlisTraceError(f"--blis-trace {d}: no such experiment directory")
    inputs = [p for p in d.iterdir() if p.is_file()]
    check_prefix(prefix, inputs)  # before the (seconds-long) load
    e = experiment if experiment is not None else load_for_export(d, output_len, prompt_reuse)
    extras = server_extras(d)
    return export_blis_trace(
        e,
        prefix,
        server_max_model_len=extras.get("max_model_len"),
        gpu_memory_utilization=extras.get("gpu_memory_utilization"),
        inputs=inputs,
        **kwargs,
    )


def read_blis_results(path: str | Path) -> dict[int, tuple[float, float]]:
    """BLIS's --results-path file (a JSON list of SimResult: request_id, ttft_us, e2e_us, ...; one
    entry per request that completed in the simulation) as {request index: (ttft_us, e2e_us)}."""
    p = Path(path)
    data = read_json(p, BlisTraceError, "BLIS results file")
    if data is None:
        data = []
    if not isinstance(data, list):
        raise BlisTraceError(f"{p}: expected a JSON list of BLIS results (blis replay --results-path)")
    out: dict[int, tuple[float, float]] = {}
    for k, r in enumerate(data):
        try:
            rid, ttft, e2e = r["request_id"], float(r["ttft_us"]), float(r["e2e_us"])
        except (TypeError, KeyError, ValueError) as ex:
            raise BlisTraceError(f"{p}: entry {k} is not a BLIS result ({type(ex).__name__}: {ex})"[:300]) from None
        if isinstance(rid, bool) or not isinstance(rid, int) or not (math.isfinite(ttft) and math.isfinite(e2e)):
            raise BlisTraceError(f"{p}: entry {k} has a bad request_id or non-finite times")
        if rid in out:
            raise BlisTraceError(f"{p}: request {rid} appears twice")
        out[rid] = (ttft, e2e)
    return out
