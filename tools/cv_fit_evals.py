"""How many closed-loop evaluations a warm-started fold fit needs (issue 25, `--cv-fit-evals`).

For programs of a run's archive (fully evaluated ones, spread over the ranks of their validation
loss), the full fit a promoted child gets (from the program's stored constants), then its folds
warm-started from that one fit with each budget in --evals. The CV loss is what a `--cv` search
selects by, so a smaller budget is judged by how it ranks the programs against the largest
budget's ranking, by how far its losses move, and by its CPU.

    python tools/cv_fit_evals.py ARCHIVE_DIR --data ../shared/data/replay [--cv lomo] [--programs 20]
        [--evals 1,2,3,6] > rows.jsonl    (the summary goes to stderr)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np
from scipy.stats import spearmanr

from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl.program import parse_program
from stepml_evolve.evaluator.fit.crossval import cross_validate
from stepml_evolve.evaluator.fit.fitting import fit_constants
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.search.cascade import Cascade
from stepml_evolve.evolve.search.settings import SearchConfig


def spread_sample(programs: list, n: int) -> list:
    """n programs evenly spaced over the ranks of their validation loss (best and worst included)."""
    ranked = sorted((p for p in programs if p.stage == "full" and p.val_loss is not None), key=lambda p: p.val_loss)
    picks = np.unique(np.linspace(0, len(ranked) - 1, min(n, len(ranked))).round().astype(int))
    return [ranked[i] for i in picks]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("archive")
    ap.add_argument("--data", required=True)
    ap.add_argument("--cv", default="lomo")
    ap.add_argument("--programs", type=int, default=20)
    ap.add_argument("--evals", default="1,2,3,6")
    args = ap.parse_args()
    budgets = sorted(int(k) for k in args.evals.split(","))
    archive = Archive.open(args.archive)
    try:
        programs = spread_sample(archive.programs(archive.run().id), args.programs)
    finally:
        archive.close()
    data = load_data(args.data)
    rows = []
    with ReplayPool(data.experiments) as pool:
        cascade = Cascade(data, pool, SearchConfig(seed=7, cv=args.cv))
        for p in programs:
            program = parse_program(p.source)
            start = dict(p.constants)
            config = cascade.full_fit_config(p.id, SearchConfig.full_fit_evals, SearchConfig.full_fit_sigma)
            full = fit_constants(program, cascade.exps, pool, config, start=start)
            row = {"id": p.id, "val_loss": p.val_loss, "train_loss": full.loss, "cv": {}}
            for k in budgets:
                c0 = time.process_time()
                cv = cross_validate(
                    program,
                    cascade.exps,
                    pool,
                    args.cv,
                    cascade.folds,
                    config,
                    warm=(dataclasses.replace(config, max_evals=k), full),
                )
                row["cv"][k] = {
                    "loss": cv.loss,
                    "evaluations": sum(f.fit.evaluations for f in cv.folds),
                    "cpu_seconds": round(time.process_time() - c0, 2),
                }
            print(json.dumps(row), flush=True)
            rows.append(row)
    ref = budgets[-1]
    loss = {k: np.array([r["cv"][k]["loss"] for r in rows]) for k in budgets}
    top = set(np.argsort(loss[ref])[:5])
    for k in budgets:
        ratio = np.log(loss[k] / loss[ref])
        print(
            f"--cv-fit-evals {k}: CPU {np.mean([r['cv'][k]['cpu_seconds'] for r in rows]):.1f} s a child, "
            f"{np.mean([r['cv'][k]['evaluations'] for r in rows]):.1f} fold evaluations; CV loss over {ref}'s: "
            f"geometric mean {np.exp(ratio.mean()):.3f}, sd of log {ratio.std():.3f}; rank correlation "
            f"{spearmanr(loss[k], loss[ref])[0]:.3f}; {len(top & set(np.argsort(loss[k])[:5]))} of {ref}'s best 5 "
            "in its best 5",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
