"""What a promoted child's full fit buys per closed-loop evaluation (issue 25): for each seed,
the screening fit the search gives a child (from the seed's constants), then full fits from its
constants with several (evaluations, candidates per iteration) budgets, timed, with their train
and validation losses.

    python tools/full_fit_budgets.py ../shared/data/replay [--seeds a,b] [--budgets 12x3,6x1,4x1] > out.jsonl
"""

from __future__ import annotations

import argparse
import json
import time

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.engine import Engine
from stepml_evolve.evaluator.experiments import SPLITS
from stepml_evolve.evaluator.fitting import FitConfig, fit, quick_config
from stepml_evolve.evolve.search.settings import SearchConfig
from stepml_evolve.seeds import seed_path, seed_paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--seeds", default=",".join(p.stem for p in seed_paths()))
    ap.add_argument("--budgets", default="12x3,12x1,6x1,4x1")
    ap.add_argument("--surrogate-evals", type=int, default=None, help="per trust-region iteration (default 200 + 40 n)")
    args = ap.parse_args()
    data = load_data(args.data)
    exps = data.experiments
    with Engine(exps) as engine:
        for name in args.seeds.split(","):
            program = load_program(seed_path(name))
            t0, c0 = time.perf_counter(), time.process_time()
            quick = fit(program, exps, engine, quick_config(7, exps), start=program.constants)
            row = {
                "seed": name,
                "quick": {
                    "seconds": round(time.perf_counter() - t0, 1),
                    "cpu_seconds": round(time.process_time() - c0, 1),
                    "loss": quick.loss,
                },
            }
            start = quick.constants["all"]
            for budget in args.budgets.split(","):
                evals, candidates = map(int, budget.split("x"))
                config = FitConfig(
                    seed=7,
                    max_evals=evals,
                    sigma0=SearchConfig.full_fit_sigma,
                    candidates=candidates,
                    surrogate_evals=args.surrogate_evals,
                )
                t0, c0 = time.perf_counter(), time.process_time()
                res = fit(program, exps, engine, config, start=start)
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                vec = [res.constants["all"][k] for k in program.constants]
                rows = engine.score(program, [vec] * len(exps), SPLITS)
                row[budget] = {
                    "seconds": round(seconds, 1),
                    "cpu_seconds": round(cpu, 1),
                    "evaluations": res.evaluations,
                    "iterations": res.iterations,
                    "train": res.loss,
                    "validate": config.objective.of_rows(rows["validate"]),
                }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
