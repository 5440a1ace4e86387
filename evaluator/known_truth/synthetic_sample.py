"""The built-in synthetic sample: experiments made by the replay simulator from a hidden oracle.

The oracle (documented here, not shipped as a seed, so the search has something to find):

    step_time        = 2500 + max(1.7 * (gemm_pf + gemm_dc + attn_pf + attn_dc),
                                  1.45 * (weights + kv_read + kv_write))
                       + 1.2 * allreduce + 12 * n_req                       [us]
    queueing_time    = 1800 + 0.5 * input_tokens + 1.2 * last_step_us       [us]
    output_token_time = 35                                                  [us]

The workload follows the real runs' load generator (inference-perf's shared-prefix data): a list
of 100 prompts, each a system prompt of its group and a question, sent in turn (request i sends
prompt i % 100; now and then two sends arrive swapped), replayed with the prefix cache serving what
an earlier send left (evaluator/data/prompt_reuse.py; the loader finds the cycle again, as on real
data). Measured E2E and TTFT get independent multiplicative log-normal noise (sigma 2%), the
reported output token counts are exact, and requests still unfinished at the client timeout
are recorded as failures, like the real data. Four experiments (dense TP1, GQA TP4, MoE TP2,
and one overloaded long-output run) of 1,200-2,400 requests keep the default job quick.
Everything is a deterministic function of the generator seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.hardware.catalog import catalog
from stepml_evolve.evaluator.hardware.model_arch import ModelArch
from stepml_evolve.evaluator.known_truth.replay_files import GeneratedExperiment, write_generated

GENERATOR_VERSION = 3  # 2: prefix caching by blocks (the replay's KV cache), BLIS step semantics; 3: cycled
# prompts, and the engine's pipeline lag in queueing_time (r.last_step_us), as the real data show
ORACLE_SOURCE = '''"""Synthetic oracle."""
CONSTANTS = {"base_us": 2500.0, "c_compute": 1.7, "c_memory": 1.45, "c_comm": 1.2, "per_req_us": 12.0,
             "queue_us": 1800.0, "queue_per_token_us": 0.5, "lag_steps": 1.2, "out_tok_us": 35.0}

def step_time(f, c):
    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc
    memory = f.weights + f.kv_read + f.kv_write
    return c.base_us + max(c.c_compute * compute, c.c_memory * memory) + c.c_comm * f.allreduce + c.per_req_us * f.n_req

def queueing_time(r, c):
    return c.queue_us + c.queue_per_token_us * r.input_tokens + c.lag_steps * r.last_step_us

def output_token_time(c):
    return c.out_tok_us
'''

MODELS = {name: m.model_config for name, m in catalog().models.items()}  # model_config by id

# name, model, tp, kv blocks, stages [(seconds, rate)], system prompt, question, output len, groups, timeout s
SCENARIOS = [
    (
        "synth-llama-2-7b-tp1-general",
        "meta-llama/Llama-2-7b-hf",
        1,
        7462,
        [(150, 4.0), (150, 10.0)],
        100,
        450,
        248,
        9,
        300.0,
    ),
    ("synth-llama-2-70b-tp4-codegen", "meta-llama/Llama-2-70b-hf", 4, 31356, [(300, 5.0)], 100, 470, 247, 11, 300.0),
    (
        "synth-mixtral-8x7b-tp2-roleplay",
        "mistralai/Mixtral-8x7B-v0.1",
        2,
        27510,
        [(300, 6.0)],
        150,
        600,
        251,
        10,
        300.0,
    ),
    (
        "synth-codellama-34b-tp2-reasoning",
        "codellama/CodeLlama-34b-Instruct-hf",
        2,
        26602,
        [(300, 4.0)],
        100,
        930,
        1448,
        23,
        90.0,
    ),
]
NOISE_SIGMA = 0.02
N_PROMPTS = 100  # the prompt list the client cycles through


@dataclass(frozen=True)
class SampleSize:
    """How much of each scenario the sample holds. The small one keeps what the full one shows
    (several rounds of a cycled prompt list, one overloaded experiment with time-outs) in a fifth
    of the requests: a shorter load, a shorter prompt list, and the reasoning run's client limit
    set where its shorter overload times out about the same share of requests (33 % against 30 %:
    all of its test split and part of its validation split, as in the full sample)."""

    scale: float  # share of every load stage's duration
    n_prompts: int
    timeouts: dict = field(default_factory=dict)  # scenario -> client time-out (s), where not the scenario's


SAMPLE_SIZES = {
    "full": SampleSize(1.0, N_PROMPTS),
    "small": SampleSize(0.2, 25, {"synth-codellama-34b-tp2-reasoning": 43.8}),
}
SWAP_RATE = 0.005  # share of consecutive sends that arrive in swapped order


def cycled_prompts(
    rng: np.random.Generator, n: int, sys_len: int, question: int, groups: int, n_prompts: int = N_PROMPTS
):
    """(prompt of each request, its input length, its system-prompt group): prompt p is in group
    p % groups; request i sends prompt i % n_prompts unless it swapped places with a neighbour."""
    lengths = (sys_len + question + rng.integers(-12, 13, size=n_prompts)).astype(np.int64)
    prompt = np.arange(n, dtype=np.int64) % n_prompts
    swaps = np.flatnonzero(rng.random(max(n - 1, 0)) < SWAP_RATE)
    for i in swaps:
        prompt[i], prompt[i + 1] = prompt[i + 1], prompt[i]
    return prompt, lengths[prompt], prompt % groups


def _requests(rng: np.random.Generator, stages) -> np.ndarray:
    arrivals, t0 = [], 0.0
    for duration, rate in stages:
        n = int(duration * rate)
        gaps = rng.exponential(1.0 / rate, size=n)
        times = t0 + np.cumsum(gaps)
        arrivals.append(times[times < t0 + duration])
        t0 += duration
    arrival_us = np.round(np.concatenate(arrivals) * 1e6).astype(np.int64)
    return arrival_us - arrival_us[0]


def generate(seed: int = 0, size: str = "full") -> list[GeneratedExperiment]:
    """Every synthetic experiment, replayed under the oracle with measurement noise."""
    # here, not at the top: the grids of the worlds (configurations.py, through workloads.py) and the
    # command line's --size choices read this module without loading the replay
    from stepml_evolve.evaluator.dsl import compile_program, parse_program
    from stepml_evolve.evaluator.replay.closed_loop import replay
    from stepml_evolve.evaluator.replay.state import FINISHED

    sizing = SAMPLE_SIZES[size]
    oracle = parse_program(ORACLE_SOURCE)
    compiled = compile_program(oracle)
    consts = np.array(list(oracle.constants.values()))
    rng = np.random.default_rng(seed)
    out = []
    for name, model, tp, blocks, stages, sys_len, question, out_len, groups, timeout_s in SCENARIOS:
        stages = [(duration * sizing.scale, rate) for duration, rate in stages]
        timeout_s = sizing.timeouts.get(name, timeout_s)
        arrival = _requests(rng, stages)
        n = len(arrival)
        prompt, inputs, group = cycled_prompts(rng, n, sys_len, question, groups, sizing.n_prompts)
        bs = 16
        exp = Experiment.from_arrays(
            name,
            arrival,
            inputs,
            np.full(n, out_len),
            arch=ModelArch.from_model_config(MODELS[model]),
            tp=tp,
            kv_blocks=blocks,
            block_size=bs,
            prefix_group=group,
            prefix_tokens=sys_len,
            prompt=prompt,
            timeout_s=timeout_s,
            model=model,
        )
        res = replay(exp, compiled, consts)
        if not res.ok:
            raise RuntimeError(f"synthetic oracle failed on {name}: {res.failure()}")
        done = res.state == FINISHED
        e2e = np.where(done, res.e2e_us / 1e6 * rng.lognormal(0.0, NOISE_SIGMA, n), timeout_s + rng.uniform(0, 1, n))
        ttft = np.where(done, res.ttft_us / 1e6 * rng.lognormal(0.0, NOISE_SIGMA, n), np.nan)
        ttft = np.minimum(ttft, e2e)
        data = {
            "type": "shared_prefix",
            "shared_prefix": {
                "num_unique_system_prompts": groups,
                "system_prompt_len": sys_len,
                "question_len": question,
                "output_len": out_len,
            },
        }
        out.append(
            GeneratedExperiment(
                name=name,
                model=model,
                model_config=MODELS[model],
                workload=name.rsplit("-", 1)[-1],
                hardware="H100",
                tp=tp,
                max_num_seqs=128,
                max_num_batched_tokens=2048,
                kv_blocks=blocks,
                block_size=bs,
                arrival_us=arrival,
                input_tokens=inputs,
                output_tokens=np.full(n, out_len),
                done=done,
                e2e_s=e2e,
                ttft_s=ttft,
                generator={"version": GENERATOR_VERSION, "seed": seed},
                profile_data=data,
                stages=stages,
            )
        )
    return out


def write_sample(out_dir: str | Path, seed: int = 0, size: str = "full") -> list[Path]:
    """Write the synthetic sample in the replay format; returns the experiment directories."""
    return [write_generated(Path(out_dir), g) for g in generate(seed, size)]
