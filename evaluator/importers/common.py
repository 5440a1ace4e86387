"""What every importer shares: the measured requests, the deployment they ran on, and their files in
the replay layout (requests.json, ground_truth.json, profile.json, exp-config.yaml), which the one
writer of an experiment (data/experiment_writer.py) writes.

Deployment: what a source does not record comes from flags, else from a YAML file beside the
source (`<SRC stem>.deployment.yaml`, else `deployment.yaml` in SRC's directory), else from what
the source itself records (a BLIS trace header's `server` block). Keys (DEPLOYMENT_KEYS): model
(Hugging Face id), hardware (H100 or A100-80GB), tp, max_num_seqs, max_num_batched_tokens,
kv_blocks (the GPU KV cache in blocks), block_size, model_config (a Hugging Face config.json,
relative to the YAML), and optionally max_model_len and client_timeout_s. The architecture comes
from model_config, else from the built-in catalog by model id (case-insensitive).

Writing: into a temporary directory beside DIR, loaded back with the tool's own loader, then
renamed to DIR; any problem leaves nothing behind. A non-empty existing DIR is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from stepml_evolve.evaluator.data.experiment_reader import load_experiment
from stepml_evolve.evaluator.data.experiment_writer import write_experiment
from stepml_evolve.evaluator.data.experiments import (
    MAX_BLOCK_SIZE,
    MAX_KV_BLOCKS,
    MAX_SEQS,
    MAX_TOKENS,
    MAX_TP,
    ExperimentError,
    LoadOptions,
)
from stepml_evolve.evaluator.errors import UserError, shown
from stepml_evolve.evaluator.hardware.catalog import catalog
from stepml_evolve.evaluator.hardware.hardware import get_hardware
from stepml_evolve.evaluator.hardware.model_arch import ModelArch
from stepml_evolve.evaluator.outputs import OutputError, check_output_dir
from stepml_evolve.evaluator.readers import CONFIG_BYTES, read_json, read_yaml


class DataImportError(UserError):
    """A source that cannot be imported: str() names the file (and 1-based data row) and the problem."""


# deployment key -> (flag, what it is); the order is the order missing fields are listed in
DEPLOYMENT_KEYS = {
    "model": ("--model", "the served model's Hugging Face id"),
    "hardware": ("--hardware", "the GPU (H100 or A100-80GB)"),
    "tp": ("--tp", "tensor parallelism"),
    "max_num_seqs": ("--max-num-seqs", "vLLM max_num_seqs"),
    "max_num_batched_tokens": ("--max-num-batched-tokens", "vLLM max_num_batched_tokens"),
    "kv_blocks": ("--kv-blocks", "GPU KV-cache blocks (vLLM's num_gpu_blocks)"),
    "block_size": ("--block-size", "KV-cache block size in tokens"),
    "model_config": ("--model-config", "a Hugging Face config.json for the architecture"),
}
OPTIONAL_KEYS = ("max_model_len", "client_timeout_s")
# integer keys and their largest value (the experiment loader's bounds, so an import never writes what it refuses)
INT_KEYS = {
    "tp": MAX_TP,
    "max_num_seqs": MAX_SEQS,
    "max_num_batched_tokens": MAX_TOKENS,
    "kv_blocks": MAX_KV_BLOCKS,
    "block_size": MAX_BLOCK_SIZE,
    "max_model_len": MAX_TOKENS,
}


@dataclass
class Measured:
    """Requests as a source recorded them (any order, any time origin)."""

    source: str  # format name
    path: Path  # the file the requests came from
    measurement: str  # client or server
    arrival_us: list[float] = field(default_factory=list)
    input_tokens: list[int] = field(default_factory=list)  # the whole prompt (shared prefix included)
    output_tokens: list[int] = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    ttft_s: list[float | None] = field(default_factory=list)
    prefix_group: list[str] = field(default_factory=list)
    prefix_length: list[int] = field(default_factory=list)
    recorded: dict = field(default_factory=dict)  # deployment values the source records
    client_timeout_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def add(self, arrival_us, input_tokens, output_tokens, failed, e2e_s, ttft_s=None, group="", prefix_length=0):
        self.arrival_us.append(float(arrival_us))
        self.input_tokens.append(int(input_tokens))
        self.output_tokens.append(int(output_tokens))
        self.failed.append(bool(failed))
        self.e2e_s.append(float(e2e_s))
        self.ttft_s.append(None if ttft_s is None else float(ttft_s))
        self.prefix_group.append(group)
        self.prefix_length.append(int(prefix_length))


def deployment_file(src: Path) -> Path | None:
    for p in (src.with_name(f"{src.stem}.deployment.yaml"), src.parent / "deployment.yaml"):
        if p.is_file():
            return p
    return None


def _read_deployment(path: Path) -> dict:
    raw = read_yaml(path, DataImportError, "deployment file")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DataImportError(f"{path}: expected a mapping of deployment keys")
    unknown = sorted(set(raw) - set(DEPLOYMENT_KEYS) - set(OPTIONAL_KEYS), key=str)
    if unknown:
        raise DataImportError(
            f"{path}: unknown key {shown(unknown[0])} (known: {', '.join([*DEPLOYMENT_KEYS, *OPTIONAL_KEYS])})"
        )
    out = dict(raw)
    if out.get("model_config") is not None:
        out["model_config"] = str(path.parent / str(out["model_config"]))
    return out


def _positive_number(v) -> bool:
    """A finite positive int or float (not a bool; an int too large for a float is not finite)."""
    try:
        return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0
    except OverflowError:
        return False


def _check_values(values: dict, where: dict) -> None:
    for key, hi in INT_KEYS.items():
        v = values.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi):
            raise DataImportError(f"{where[key]}: {key} must be an integer in 1..{hi:,}, got {shown(v)}")
    v = values.get("client_timeout_s")
    if v is not None and not _positive_number(v):
        raise DataImportError(
            f"{where['client_timeout_s']}: client_timeout_s must be a positive number, got {shown(v)}"
        )
    for key in ("model", "hardware", "model_config"):
        if values.get(key) is not None and not isinstance(values[key], str):
            raise DataImportError(f"{where[key]}: {key} must be a string, got {shown(values[key])}")


def hf_to_model_config(path: Path) -> dict:
    """A Hugging Face config.json as the replay format's model_config."""
    cfg = read_json(path, DataImportError, "model config (a Hugging Face config.json)", limit=CONFIG_BYTES)
    if not isinstance(cfg, dict):
        raise DataImportError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    keys = {
        "num_layers": "num_hidden_layers",
        "hidden_dim": "hidden_size",
        "num_heads": "num_attention_heads",
        "intermediate_dim": "intermediate_size",
    }
    missing = [hf for hf in keys.values() if hf not in cfg]
    if missing:
        raise DataImportError(f"{path}: a Hugging Face config.json needs {', '.join(missing)}")
    mc = {k: cfg[hf] for k, hf in keys.items()}
    mc["num_kv_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    mc["num_local_experts"] = cfg.get("num_local_experts") or 0
    mc["num_experts_per_tok"] = (cfg.get("num_experts_per_tok") or 0) if mc["num_local_experts"] else 0
    mc["vocab_size"] = cfg.get("vocab_size") or 32000
    try:
        ModelArch.from_model_config(mc)
    except ValueError as e:
        raise DataImportError(f"{path}: {e}") from None
    return {
        k: mc[k]
        for k in (
            "num_layers",
            "hidden_dim",
            "num_heads",
            "num_kv_heads",
            "intermediate_dim",
            "num_local_experts",
            "num_experts_per_tok",
            "vocab_size",
        )
    }


def resolve_deployment(src: Path, flags: dict, recorded: dict) -> tuple[dict, dict]:
    """The deployment (flags > deployment YAML > what the source records) and the model_config;
    raises one DataImportError listing every field still needed, one line each."""
    yaml_path = deployment_file(src)
    from_yaml = _read_deployment(yaml_path) if yaml_path else {}
    where = {}
    values = {}
    for key in [*DEPLOYMENT_KEYS, *OPTIONAL_KEYS]:
        for origin, source in (("flag", flags), (str(yaml_path), from_yaml), (str(src), recorded)):
            if source.get(key) is not None:
                values[key] = source[key]
                where[key] = f"--{key.replace('_', '-')}" if origin == "flag" else origin
                break
    _check_values(values, {k: where.get(k, str(src)) for k in [*DEPLOYMENT_KEYS, *OPTIONAL_KEYS]})
    if values.get("hardware") is not None:
        try:
            values["hardware"] = get_hardware(values["hardware"]).name
        except KeyError as e:
            raise DataImportError(f"{where['hardware']}: {e.args[0]}") from None
    model_config = None
    if values.get("model_config"):
        model_config = hf_to_model_config(Path(values["model_config"]))
    elif values.get("model"):
        by_id = {name.lower(): m for name, m in catalog().models.items()}
        m = by_id.get(str(values["model"]).lower())
        if m is not None:
            model_config = m.model_config
            values["model"] = m.name
    missing = []
    for key, (flag, what) in DEPLOYMENT_KEYS.items():
        if key == "model_config":
            if model_config is None and values.get("model"):
                missing.append(
                    f"  {flag} FILE (key model_config): {what}; {values['model']} is not built in "
                    f"(built in: {', '.join(catalog().models)})"
                )
            continue
        if values.get(key) is None:
            missing.append(f"  {flag} (key {key}): {what}")
    if missing:
        yaml_name = yaml_path or src.with_name(f"{src.stem}.deployment.yaml")
        raise DataImportError(
            f"{src}: {len(missing)} deployment field(s) not recorded by the source; give each as a "
            f"flag or a key in {yaml_name}:\n" + "\n".join(missing)
        )
    return values, model_config


def check_out_dir(out: Path) -> None:
    """The output rule for a directory (evaluator/outputs.py), as this command's error."""
    try:
        check_output_dir(out)
    except OutputError as e:
        raise DataImportError(f"--out {e}") from None


def _uniform_output_len(m: Measured) -> int | None:
    ok = [o for o, f in zip(m.output_tokens, m.failed) if not f]
    return ok[0] if ok and ok[0] > 0 and all(o == ok[0] for o in ok) else None


def write_measured(m: Measured, out: Path, deployment: dict, model_config: dict) -> Path:
    """Write the measured requests as one experiment at `out` (atomic: temp dir, checked, renamed)."""
    out = Path(out)
    check_out_dir(out)
    n = len(m.arrival_us)
    if n == 0:
        raise DataImportError(f"{m.path}: no requests")
    if all(m.failed):
        raise DataImportError(f"{m.path}: no successful request: nothing to compare a replay against")
    arrival = np.asarray(m.arrival_us, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    t0 = arrival[order[0]]
    group_length: dict[str, int] = {}
    for i in range(n):
        g = m.prefix_group[i]
        if g and group_length.setdefault(g, m.prefix_length[i]) != m.prefix_length[i]:
            raise DataImportError(
                f"{m.path}: request {i + 1} of prefix group {g!r} has prefix_length "
                f"{m.prefix_length[i]}, an earlier one {group_length[g]} (one group, one shared prefix)"
            )
    requests, truth = [], []
    for k, i in enumerate(order):
        i = int(i)
        rec = {
            "index": k,
            "arrival_time_us": int(round(arrival[i] - t0)),
            "input_tokens": m.input_tokens[i],
            "output_tokens": m.output_tokens[i],
            "prefix_group": m.prefix_group[i],
            "has_error": m.failed[i],
        }
        if m.prefix_group[i]:
            rec["prefix_length"] = m.prefix_length[i]
        requests.append(rec)
        t = {"index": k, "has_error": m.failed[i], "e2e_s": m.e2e_s[i]}
        if not m.failed[i]:
            t["ttft_s"] = m.ttft_s[i]
        truth.append(t)
    model = deployment["model"]
    config = {
        "tensor_parallelism": deployment["tp"],
        "max_num_seqs": deployment["max_num_seqs"],
        "max_num_batched_tokens": deployment["max_num_batched_tokens"],
        "kv_blocks_total_gpu": deployment["kv_blocks"],
        "block_size": deployment["block_size"],
        "hardware": deployment["hardware"],
    }
    timeout = deployment.get("client_timeout_s") or m.client_timeout_s
    if timeout:
        config["client_timeout_s"] = float(timeout)
    meta = {
        "experiment": out.name,
        "model_id": model,
        "model_short": model.split("/")[-1].lower(),
        "profile": m.source,
        "split": "",
        "measurement": m.measurement,
        "imported_from": {"format": m.source, "path": str(m.path)},
        "config": config,
        "model_config": model_config,
        "requests": requests,
    }
    shared = {"num_unique_system_prompts": len(group_length)}
    out_len = _uniform_output_len(m)
    if out_len is not None:
        shared["output_len"] = out_len  # every successful request generated this many tokens
    profile = {"imported_from": m.source, "data": {"shared_prefix": shared}}
    exp_config = {
        "model": model,
        "tensor_parallel_size": deployment["tp"],
        "max_num_seqs": deployment["max_num_seqs"],
        "max_num_batched_tokens": deployment["max_num_batched_tokens"],
        "block_size": deployment["block_size"],
        "num_gpu_blocks_override": deployment["kv_blocks"],
    }
    if deployment.get("max_model_len"):
        exp_config["max_model_len"] = deployment["max_model_len"]

    files = {
        "requests.json": json.dumps(meta, indent=1) + "\n",
        "ground_truth.json": json.dumps(truth, indent=1) + "\n",
        "profile.json": json.dumps(profile, indent=2) + "\n",
        "exp-config.yaml": yaml.safe_dump(exp_config, sort_keys=False),
    }

    def loads(tmp: Path) -> None:
        try:
            load_experiment(tmp, LoadOptions())
        except ExperimentError as e:
            raise DataImportError(f"{m.path}: the imported experiment does not load: {e.problem}") from None

    try:
        return write_experiment(out, files, check=loads)
    except OutputError as e:
        raise DataImportError(f"--out {e}") from None
    except OSError as e:
        raise DataImportError(f"--out {e.filename or out}: cannot write ({e.strerror or e}); nothing written") from None
