"""CPU seconds of the closed-loop replay and of `record` (the replay plus its reduction to the
trajectory surrogate) over every experiment, one thread, at a seed's shipped constants (issue 25).

    python tools/record_cost.py [../shared/data/replay] [--seed trained_physics]
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default="../shared/data/replay")
    ap.add_argument("--seed", default="trained_physics")
    args = ap.parse_args()
    data = load_data(args.data)
    program = load_program(seed_path(args.seed))
    compiled, vector = compile_program(program), VectorProgram.of(program)
    constants = np.array(list(program.constants.values()), dtype=float)
    replay_s = record_s = 0.0
    for e in data.experiments:
        horizon = split_horizon(e, ("train",))
        replay(e, compiled, constants, horizon=horizon, record=True)  # compiled code loaded outside the timing
        t0 = time.process_time()
        replay(e, compiled, constants, horizon=horizon, record=True)
        t1 = time.process_time()
        record(e, compiled, vector, constants)
        t2 = time.process_time()
        replay_s, record_s = replay_s + t1 - t0, record_s + t2 - t1
    print(f"replay {replay_s:.2f}s  record (replay included) {record_s:.2f}s  reduction {record_s - replay_s:.2f}s")


if __name__ == "__main__":
    main()
