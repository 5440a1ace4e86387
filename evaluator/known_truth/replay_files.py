"""Generated experiments written in the replay format (../shared/data/README.md) by the one writer
of an experiment (data/experiment_writer.py): the built-in synthetic sample and the known-truth worlds.

A generator replays its hidden law, adds measurement noise, and hands the outcome here as a
`GeneratedExperiment`; the files it becomes are what a real run leaves: requests.json (with the
served configuration and the model's config), ground_truth.json (measured E2E and TTFT; a client
timeout is a failed request with no token counts), profile.json (the load generator's
description), summary_lifecycle_metrics.json and exp-config.yaml.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.data.experiment_writer import write_experiment


@dataclass(frozen=True)
class GeneratedExperiment:
    name: str
    model: str  # Hugging Face id
    model_config: dict
    workload: str  # the profile name (`lowo` folds by it)
    hardware: str
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: int
    block_size: int
    arrival_us: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    done: np.ndarray  # bool: finished (else a client timeout)
    e2e_s: np.ndarray  # measured (noisy) E2E; a failed request's is when the client gave up
    ttft_s: np.ndarray  # NaN where not finished
    generator: dict  # written as requests.json's "generator"
    profile_data: dict  # profile.json's "data" (the load generator's description of the prompts)
    stages: list  # [(seconds, rate)] of the load
    config_extra: dict = field(default_factory=dict)  # more requests.json config fields
    failed_tokens: bool = False  # write a failed request's token counts (real runs leave them 0)


def _files(g: GeneratedExperiment) -> tuple[dict, list, dict, dict]:
    n, done = len(g.arrival_us), g.done
    requests = {
        "experiment": g.name,
        "model_id": g.model,
        "model_short": g.model.split("/")[-1].lower(),
        "profile": g.workload,
        "split": "train",
        "synthetic": True,
        "hardware": g.hardware,
        "generator": g.generator,
        "config": {
            "tensor_parallelism": g.tp,
            "max_num_seqs": g.max_num_seqs,
            "max_num_batched_tokens": g.max_num_batched_tokens,
            "kv_blocks_total_gpu": g.kv_blocks,
            "block_size": g.block_size,
            "num_prefix_groups": 0,
            "users_per_group": 0,
            "system_prompt_len": 0,
            **g.config_extra,
        },
        "model_config": g.model_config,
        "requests": [
            {
                "index": i,
                "arrival_time_us": int(g.arrival_us[i]),
                "input_tokens": int(g.input_tokens[i]) if done[i] or g.failed_tokens else 0,
                "output_tokens": int(g.output_tokens[i]) if done[i] or g.failed_tokens else 0,
                "prefix_group": "",
                "has_error": bool(not done[i]),
            }
            for i in range(n)
        ],
    }
    truth = [
        {
            "index": i,
            "has_error": bool(not done[i]),
            "e2e_s": float(g.e2e_s[i]),
            **({"ttft_s": float(g.ttft_s[i])} if done[i] else {}),
        }
        for i in range(n)
    ]
    profile = {
        "data": g.profile_data,
        "load": {"type": "constant", "stages": [{"duration": d, "rate": r} for d, r in g.stages]},
        "server": {"ignore_eos": True, "model_name": g.model},
        "synthetic": True,
    }
    summary = {
        "successes": {
            "count": int(done.sum()),
            "latency": {
                "request_latency": {"mean": float(g.e2e_s[done].mean()) if done.any() else None},
                "time_to_first_token": {"mean": float(g.ttft_s[done].mean()) if done.any() else None},
            },
        },
        "failures": {"count": int((~done).sum())},
    }
    return requests, truth, profile, summary


def write_generated(out_dir: Path, g: GeneratedExperiment) -> Path:
    """Write one experiment's files as out_dir/<name>, whole or not at all; returns that directory."""
    requests, truth, profile, summary = _files(g)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    files = {
        "requests.json": json.dumps(requests),
        "ground_truth.json": json.dumps(truth),
        "profile.json": json.dumps(profile, indent=1),
        "summary_lifecycle_metrics.json": json.dumps(summary, indent=1),
        "exp-config.yaml": (
            f"model: {g.model}\ntensor_parallelism: {g.tp}\nmax_model_len: 4096\n"
            f"max_num_batched_tokens: {g.max_num_batched_tokens}\nmax_num_seqs: {g.max_num_seqs}\n"
            "app: stepml-evolve synthetic\n"
        ),
    }
    return write_experiment(Path(out_dir) / g.name, files)
