"""CPU seconds of the closed-loop replay over every experiment's training window, one thread, at a
seed's shipped constants (issue 25): the plain replay (what scoring runs), the replay keeping the
trajectory (steps and runs, what `record` replays) and `record` (that replay plus its reduction to
the trajectory surrogate). Each is the fastest of --repeat runs per experiment.

    python tools/record_cost.py [../shared/data/replay] [--seed trained_physics] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import compile_program, load_program
from stepml_evolve.evaluator.metrics import split_horizon
from stepml_evolve.evaluator.replay import replay
from stepml_evolve.evaluator.surrogate import VectorProgram, record
from stepml_evolve.seeds import seed_path


def _fastest(repeat: int, run, *args, **kwargs) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        run(*args, **kwargs)
        best = min(best, time.process_time() - t0)
    return best


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
    steps = 0
    for e in data.experiments:
        horizon = split_horizon(e, ("train",))
        res = replay(e, compiled, constants, horizon=horizon)  # compiled code loaded outside the timing
        steps += res.n_steps
        plain_s += _fastest(args.repeat, replay, e, compiled, constants, horizon=horizon)
        kept_s += _fastest(args.repeat, replay, e, compiled, constants, horizon=horizon, record=True, rows=False)
        record_s += _fastest(args.repeat, record, e, compiled, vector, constants)
    print(
        f"{args.seed}: {steps} steps; replay {plain_s:.2f}s  with the trajectory {kept_s:.2f}s  "
        f"record (that replay and the reduction) {record_s:.2f}s"
    )


if __name__ == "__main__":
    main()
