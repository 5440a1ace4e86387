"""Sample batches for the generated Go test, with the values Python computes for them.

Expected values apply the same rounding the Go side does (half to even; at least 1 us for a
step, at least 0 for the other times), so the test checks the physics and the program, not
rounding conventions. A value the replay refuses (a step not above 0, or below its physical floor
when the model holds steps to it; a delay below 0 or not a number) is expected as PANICS: the Go
model must panic there, as the replay fails.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np

from stepml_evolve.evaluator.hardware.catalog import catalog
from stepml_evolve.evaluator.hardware.components import coefficients, from_trajectory
from stepml_evolve.evaluator.hardware.hardware import get_hardware

PANICS = -1  # the expected value of a sample the Go model must refuse (panic on)

if TYPE_CHECKING:  # the VM loads numba: imported where samples are made, not with DEFAULT_SAMPLES
    from stepml_evolve.evaluator.dsl import Program, ScalarProgram

# The deployments of the real data: dense MHA TP1, GQA TP4, MoE TP2, GQA TP2; plus one A100.
DEFAULT_DEPLOYMENTS = [
    ("meta-llama/Llama-2-7b-hf", 1, "H100"),
    ("meta-llama/Llama-2-70b-hf", 4, "H100"),
    ("mistralai/Mixtral-8x7B-v0.1", 2, "H100"),
    ("codellama/CodeLlama-34b-Instruct-hf", 2, "H100"),
    ("meta-llama/Llama-2-7b-hf", 2, "A100-80GB"),
]


def micros(x: float, floor: float) -> int:
    if not (x >= floor):
        return int(floor)
    return int(np.round(min(x, 1e15)))


def _batch(rng: random.Random, budget: int = 2048) -> list[tuple[int, int, int, int]]:
    """(input, output, progress, new tokens) per request; prefill chunks share the budget."""
    reqs = []
    n = rng.choice([1, 2, 4, 8, 16, 32, 48])
    for _ in range(n):
        inp = rng.randint(1, 4000)
        out = rng.randint(1, 1500)
        if rng.random() < 0.3 and budget > 0:  # a prefill chunk
            progress = rng.choice([0, 0, 96, rng.randint(0, inp - 1)])
            new = min(inp - progress, rng.randint(1, budget))
            budget -= new
        else:  # a decode: context at least the prompt
            progress = inp + rng.randint(0, out)
            new = 1
        reqs.append((inp, out, progress, new))
    if rng.random() < 0.1:
        reqs.append((100, 10, 50, 0))  # a running request that got no tokens this step
    return reqs


def python_step_us(program: ScalarProgram, consts: np.ndarray, k: np.ndarray, reqs, floor: bool = False) -> int:
    """The step as one trajectory step: scheduled requests only, in prefill while progress < input;
    PANICS where the step is not above 0 or (floor) below its physical floor."""
    from stepml_evolve.evaluator.physics.floor import TOLERANCE, floor_of

    slots = np.array([r for r in reqs if r[3] > 0], dtype=np.int64).reshape(-1, 4)
    inputs, progress, new = slots[:, 0], slots[:, 2], slots[:, 3]
    f = from_trajectory(np.zeros(len(slots), np.int64), new, progress, progress < inputs, 1, k)[:, 0]
    x = program.step_time(f, consts)
    if not x > 0 or (floor and x < floor_of(f[:, None])[0] * (1 - TOLERANCE)):
        return PANICS
    return micros(x, 1)


def python_delay_us(x: float) -> int:
    """A queueing, output-token or post-decode delay as Go rounds it; PANICS below 0 or not a number."""
    return micros(x, 0) if x >= 0 else PANICS


DEFAULT_SAMPLES = 1000  # batches in the generated Go test


def samples(
    program: Program,
    n_batches: int = DEFAULT_SAMPLES,
    seed: int = 0,
    deployments=DEFAULT_DEPLOYMENTS,
    floor: bool = True,
) -> dict:
    """Template context for the Go test: deployments, step samples (n_batches random ones, then an
    empty batch and one of an unscheduled request per deployment), queueing samples. floor: the
    model holds its steps to the physical floor (as go_source's `floor`)."""
    from stepml_evolve.evaluator.dsl import ScalarProgram, compile_program

    rng = random.Random(seed)
    sp = ScalarProgram(compile_program(program))
    consts = np.array(list(program.constants.values()), dtype=float)
    deps, ks = [], []
    for model, tp, hw_name in deployments:
        arch, hw = catalog().models[model].arch, get_hardware(hw_name)
        deps.append(
            {
                "layers": arch.layers,
                "hidden": arch.hidden,
                "heads": arch.heads,
                "kv_heads": arch.kv_heads,
                "ffn": arch.ffn,
                "experts": arch.num_experts,
                "top_k": arch.top_k,
                "vocab": arch.vocab,
                "hw": hw.go_name,
                "tp": tp,
            }
        )
        ks.append(coefficients(arch, hw, tp))
    batches = [(i % len(deployments), _batch(rng)) for i in range(n_batches)]
    batches += [(d, reqs) for d in range(len(deployments)) for reqs in ([], [(5, 1, 0, 0)])]
    steps = [
        {"deployment": d, "want": python_step_us(sp, consts, ks[d], reqs, floor), "reqs": [v for r in reqs for v in r]}
        for d, reqs in batches
    ]
    queue = []
    for _ in range(50):
        inp, out = rng.randint(1, 4000), rng.randint(1, 1500)
        last = rng.choice([0, rng.randint(1, 200_000)])  # before the first step, or a step's duration
        queue.append([inp, out, last, python_delay_us(sp.queueing_time(inp, out, consts, last))])
    return {
        "deployments": deps,
        "steps": steps,
        "queue": queue,
        "output_token_us": python_delay_us(sp.output_token_time(consts)),
        "post_decode_us": python_delay_us(sp.post_decode_time(consts)),
        "panics": PANICS,
    }


__all__ = ["samples", "micros", "DEFAULT_DEPLOYMENTS", "PANICS"]
