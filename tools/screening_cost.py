"""What a parent's screening costs (evaluator/discovery/screening.py), and what its prefix sums
cost: the program's per-request residuals at its file's constants, then the screening of the term
library on them, timed with the compiled prefix sums (`residuals.prefix_sums`, today's) and with
numpy's cumsum along the steps (before), interleaved in one process so both see the same machine;
and a check that both give the same gains. With --refit, also the screening with the program's
own constants refitted beside each term (discovery/refit.py, as `screen_program` screens), the
refit columns' computation included.

    python tools/screening_cost.py [../shared/data/replay] [--program seeds/regime_switch.py] [--repeat 2] [--refit]

docs/results/index.md ("screening") cites it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.discovery import residuals as residuals_module
from stepml_evolve.evaluator.discovery.refit import refit_columns
from stepml_evolve.evaluator.discovery.screening import screen
from stepml_evolve.evaluator.discovery.terms import library, step_values
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.scoring.pool import ReplayPool


def numpy_cumsum(g: np.ndarray) -> np.ndarray:
    c = np.zeros((g.shape[0] + 1, g.shape[1]))
    np.cumsum(g, axis=0, out=c[1:])
    return c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="?", default="../shared/data/replay", help="A replay data directory.")
    parser.add_argument("--program", default="seeds/regime_switch.py", help="The program whose residuals are screened.")
    parser.add_argument("--repeat", type=int, default=2, help="Screenings timed per variant.")
    parser.add_argument("--refit", action="store_true", help="Also time the screening beside the refitted constants.")
    args = parser.parse_args()
    loaded = load_data(Path(args.data))
    program = load_program(Path(args.program))
    with ReplayPool(loaded.experiments) as pool:
        t0 = time.perf_counter()
        found = residuals_module.residuals_of(program, program.constants, pool)
        replay_s = time.perf_counter() - t0
    terms = library(step_values([r.components for r in found]))
    print(
        f"{args.program}: {sum(r.n for r in found)} requests, {sum(r.n_steps for r in found)} steps, "
        f"{len(terms)} terms; residuals {replay_s:.1f} s"
    )
    compiled = residuals_module.prefix_sums
    compiled(np.ones((3, 2)))  # compiled (or loaded from numba's cache) before any timing
    seconds: dict[str, list[float]] = {"compiled": [], "numpy cumsum": []}  # "refit" too, with --refit
    gains: dict[str, list[float]] = {}
    try:
        for _ in range(args.repeat):
            for name, fn in (("numpy cumsum", numpy_cumsum), ("compiled", compiled)):
                residuals_module.prefix_sums = fn
                t0 = time.perf_counter()
                result = screen(found, terms)
                seconds[name].append(time.perf_counter() - t0)
                gains.setdefault(name, [s.gain for s in result.results])
            if args.refit:
                t0 = time.perf_counter()
                screen(found, terms, refit=refit_columns(program, program.constants, found))
                seconds.setdefault("refit", []).append(time.perf_counter() - t0)
    finally:
        residuals_module.prefix_sums = compiled
    for name, times in seconds.items():
        print(
            f"screening, {name:12s}: median {statistics.median(times):.1f} s of {', '.join(f'{t:.1f}' for t in times)}"
        )
    print("the same gains:", gains["compiled"] == gains["numpy cumsum"])


if __name__ == "__main__":
    main()
