"""Warm-started against independent fold fits (issue 25): for each seed, the full fit a promoted
child gets (`--full-fit-evals`, sigma 0.2, from the seed's constants) with `--cv lomo|lowo` folds
fitted both ways, timed, with their closed-loop evaluations, CV loss and held-out APE.

    python tools/cv_warm_vs_independent.py ../shared/data/replay [--protocol lomo] [--seed-programs a,b] > out.json
"""

from __future__ import annotations

import argparse
import json
import time

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.search.cascade import Cascade
from stepml_evolve.evolve.search.settings import SearchConfig
from stepml_evolve.seeds import seed_path, seed_paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--protocol", default="lomo")
    ap.add_argument("--seed-programs", default=",".join(p.stem for p in seed_paths()))
    ap.add_argument("--fold-evals", type=int, default=3)
    ap.add_argument("--full-fit-evals", type=int, default=SearchConfig.full_fit_evals)
    args = ap.parse_args()
    data = load_data(args.data)
    out = []
    with ReplayPool(data.experiments) as pool:
        for name in args.seeds.split(","):
            program = load_program(seed_path(name))
            row = {"seed": name}
            for label, cv, n in (
                ("plain", "none", 0),
                ("warm", args.protocol, args.fold_evals),
                ("independent", args.protocol, 0),
            ):
                cascade = Cascade(data, pool, SearchConfig(seed=7, cv=cv, cv_fit_evals=n))
                t0, c0 = time.perf_counter(), time.process_time()
                full = cascade._full_fit(
                    program, program.constants, 7, args.full_fit_evals, SearchConfig.full_fit_sigma
                )
                row[label] = {
                    "seconds": round(time.perf_counter() - t0, 1),
                    "cpu_seconds": round(time.process_time() - c0, 1),
                    "evaluations": cascade.take_evaluations(),
                    "train_loss": full.train_loss,
                    "val_loss": full.val_loss,
                    **({"e2e_mean": full.cv.e2e_mean, "ttft_mean": full.cv.ttft_mean} if full.cv else {}),
                }
            print(json.dumps(row), flush=True)
            out.append(row)


if __name__ == "__main__":
    main()
