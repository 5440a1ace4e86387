"""What a child's screening fit costs and finds with smaller surrogate budgets (issue 25): for
each seed, the search's quick fit (one experiment per model, the first 30 % of requests, 6
closed-loop evaluations) from the seed's constants, with the surrogate's default budget per
trust-region iteration (200 + 40 n) and with the budgets given, timed, with its quick loss. A
budget ending in "s" samples every constant by CMA-ES (no least-squares solve of the linear ones).

    python tools/quick_fit_budgets.py ../shared/data/replay [--seed-programs a,b] [--surrogate-evals 0,150,80] > out.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.fit.fitting import fit_constants, quick_config
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.seeds import seed_path, seed_paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--seed-programs", default=",".join(p.stem for p in seed_paths()))
    ap.add_argument(
        "--surrogate-evals",
        default="0,150,80",
        help="per iteration; 0: the default 200 + 40 n; a trailing s: sampled (no linear solve)",
    )
    args = ap.parse_args()
    exps = load_data(args.data).experiments
    with ReplayPool(exps) as pool:
        for name in args.seeds.split(","):
            program = load_program(seed_path(name))
            row: dict = {"seed": name}
            for label in args.surrogate_evals.split(","):
                budget = int(label.removesuffix("s"))
                config = dataclasses.replace(
                    quick_config(7, exps), surrogate_evals=budget or None, linear_solve=not label.endswith("s")
                )
                t0, c0 = time.perf_counter(), time.process_time()
                res = fit_constants(program, exps, pool, config, start=program.constants)
                row[label] = {
                    "seconds": round(time.perf_counter() - t0, 2),
                    "cpu_seconds": round(time.process_time() - c0, 2),
                    "evaluations": res.evaluations,
                    "loss": res.loss,
                }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
