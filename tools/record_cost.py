"""CPU seconds of the closed-loop replay over every experiment's training window, one thread, at a
seed's shipped constants (issue 25): the plain replay (what scoring runs), the replay keeping the
trajectory (steps and runs, what `record` replays) and `record` (that replay plus its reduction to
the trajectory surrogate). Each is the fastest of --repeat runs per experiment. Then what the
replay's steps are (decode stretches, which skip the batch, and ordinary steps, which visit it;
those with a prefill chunk) and the CPU of one step's program on the VM, alone in a loop.

    python tools/record_cost.py [../shared/data/replay] [--seed trained_physics] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import compile_program, load_program
from stepml_evolve.evaluator.dsl.vm import LOCALS_SIZE, STACK_SIZE, run_code
from stepml_evolve.evaluator.hardware.components import N_COMPONENTS
from stepml_evolve.evaluator.replay.closed_loop import experiment_coefficients, replay
from stepml_evolve.evaluator.replay.state import _component_values
from stepml_evolve.evaluator.scoring.metrics import split_horizon
from stepml_evolve.evaluator.scoring.surrogate import VectorProgram, record
from stepml_evolve.seeds import seed_path


def _fastest(repeat: int, run, *args, **kwargs) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        run(*args, **kwargs)
        best = min(best, time.process_time() - t0)
    return best


@njit(nogil=True)
def _program_steps(code, lits, entry, consts, k, n):
    """n decode steps of a growing batch context through the components and the step's program."""
    stack, local, comps, none = np.zeros(STACK_SIZE), np.zeros(LOCALS_SIZE), np.zeros(N_COMPONENTS), np.zeros(1)
    total = 0.0
    for i in range(n):
        v = _component_values(0.0, 0.0, 0.0, 0.0, 64.0, 6.4e4 + 64.0 * i, 1e3 + i, k)
        for q in range(N_COMPONENTS):
            comps[q] = v[q]
        total += run_code(code, lits, entry, comps, consts, none, stack, local)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default="../shared/data/replay")
    ap.add_argument("--seed", default="trained_physics")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    data = load_data(args.data)
    program = load_program(seed_path(args.seed))
    compiled, vector = compile_program(program), VectorProgram.of(program)
    constants = np.array(list(program.constants.values()), dtype=float)
    plain_s = kept_s = record_s = 0.0
    steps = stretch = prefill = prefill_one = prefill_batch = 0
    for e in data.experiments:
        horizon = split_horizon(e, ("train",))
        res = replay(e, compiled, constants, horizon=horizon, record=True, rows=False)
        steps += res.n_steps
        stretch += res.stretch_steps
        t = res.trajectory
        pf = t.totals[:, 0] > 0  # prefill tokens in the step
        prefill += int(pf.sum())
        prefill_one += int((pf & (t.totals[:, 1] == 1)).sum())
        prefill_batch += int(t.running[pf].sum())
        plain_s += _fastest(args.repeat, replay, e, compiled, constants, horizon=horizon)
        kept_s += _fastest(args.repeat, replay, e, compiled, constants, horizon=horizon, record=True, rows=False)
        record_s += _fastest(args.repeat, record, e, compiled, vector, constants)
    print(
        f"{args.seed}: {steps} steps; replay {plain_s:.2f}s  with the trajectory {kept_s:.2f}s  "
        f"record (that replay and the reduction) {record_s:.2f}s"
    )
    k = experiment_coefficients(data.experiments[0])
    n = 1_000_000
    _program_steps(compiled.code, compiled.literals, compiled.entries[0], constants, k, 10)
    t0 = time.process_time()
    _program_steps(compiled.code, compiled.literals, compiled.entries[0], constants, k, n)
    program_ns = (time.process_time() - t0) / n * 1e9
    print(
        f"steps: {stretch} in decode stretches ({stretch / steps:.1%}), {steps - stretch} ordinary; {prefill} with "
        f"a prefill chunk ({prefill_one} with one), {prefill_batch / max(prefill, 1):.1f} running requests in them "
        f"on average; the step's program ({len(compiled.code)} instructions) and its components: {program_ns:.0f} ns a step"
    )


if __name__ == "__main__":
    main()
