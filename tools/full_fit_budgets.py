"""What a promoted child's full fit buys per closed-loop evaluation (issue 25): for each seed,
the screening fit the search gives a child (from the seed's constants), then full fits from its
constants with several budgets, timed, with their train and validation losses. With --from seed,
the fits of generation 0 instead: from the seed's own constants at the standard sigma, no
screening fit.

A budget is EVALSxCANDIDATES[@SURROGATE][rRESTARTS][s]: closed-loop evaluations ("std": the
method's default for the program's size), closed-loop judged candidates per trust-region
iteration, surrogate evaluations per iteration (default 200 + 40 n), restarts of the trust
region from the best point (default 0), and a trailing "s" for the surrogate step sampled by
CMA-ES over every constant (no least-squares solve of the linear ones, FitConfig.linear_solve).

    python tools/full_fit_budgets.py ../shared/data/replay [--seed-programs a,b] [--budgets 12x3,6x1@150] > out.jsonl
    python tools/full_fit_budgets.py ../shared/data/replay --from seed --budgets stdx3,16x1@150 > out.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from stepml_evolve.evaluator.data.experiments import SPLITS
from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants, quick_config
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.search.settings import SearchConfig
from stepml_evolve.seeds import seed_path, seed_paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--seed-programs", default=",".join(p.stem for p in seed_paths()))
    ap.add_argument("--budgets", default="12x3,12x1,6x1,4x1")
    ap.add_argument("--surrogate-evals", type=int, default=None, help="default for budgets without @SURROGATE")
    ap.add_argument("--from", dest="start", choices=("screen", "seed"), default="screen")
    ap.add_argument("--quick-linear", choices=("on", "off"), default="on", help="the screening fit's linear solve")
    args = ap.parse_args()
    data = load_data(args.data)
    exps = data.experiments
    with ReplayPool(exps) as pool:
        for name in args.seeds.split(","):
            program = load_program(seed_path(name))
            row: dict = {"seed": name, "from": args.start}
            start, sigma = program.constants, FitConfig.sigma0
            if args.start == "screen":
                t0, c0 = time.perf_counter(), time.process_time()
                quick_cfg = dataclasses.replace(quick_config(7, exps), linear_solve=args.quick_linear == "on")
                quick = fit_constants(program, exps, pool, quick_cfg, start=program.constants)
                row["quick"] = {
                    "seconds": round(time.perf_counter() - t0, 1),
                    "cpu_seconds": round(time.process_time() - c0, 1),
                    "loss": quick.loss,
                }
                start, sigma = quick.constants["all"], SearchConfig.full_fit_sigma
            for budget in args.budgets.split(","):
                sampled = budget.endswith("s")
                evals, rest = budget.removesuffix("s").split("x")
                rest, _, restarts = rest.partition("r")
                candidates, _, surrogate = rest.partition("@")
                config = FitConfig(
                    seed=7,
                    max_evals=None if evals == "std" else int(evals),
                    sigma0=sigma,
                    candidates=int(candidates),
                    surrogate_evals=int(surrogate) if surrogate else args.surrogate_evals,
                    restarts=int(restarts or 0),
                    linear_solve=not sampled,
                )
                t0, c0 = time.perf_counter(), time.process_time()
                res = fit_constants(program, exps, pool, config, start=start)
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                vec = [res.constants["all"][k] for k in program.constants]
                rows = pool.score(program, [vec] * len(exps), SPLITS)
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
