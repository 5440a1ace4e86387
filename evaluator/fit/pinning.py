"""Which of a child's fitted constants the training data cannot tell from its seed's: those are
pinned back to the seed's value before the child is deployed.

A child refits every constant it shares with its seed. Where the data decide a constant, the refit
moves it for a reason; where they do not (on the 16 real runs, prefill efficiency: caveat 5 of the
data), the refit lets it wander within its prior, and the child then predicts a deployment those
runs do not cover differently from its seed for no reason the data gave. On the real data the
regime_switch seed plus a collective latency per layer refitted `c_compute` from 1.481 to 1.429:
the train loss is 0.18 % lower for it, and the prefill-dominated run of the other deployment style
(../shared/data/other-style, TP 1, where the new term is 0) moved from 6.7 % to 9.4 % mean E2E.

Each shared constant is put back alone at its seed's value (one closed-loop evaluation each on the
fit's split), then the cheapest ones together, in order of their cost: the longest run of them
whose train loss stays within PIN_TOLERANCE percent of the fitted one is pinned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.dsl import Program, compile_program
from stepml_evolve.evaluator.fit.fitting import FitConfig, bound_arrays, finite_loss, fit_experiments
from stepml_evolve.evaluator.scoring.pool import ReplayPool

# percent of the fitted train loss that pinning may cost: a refit that gains less than this from a
# constant has not shown the data want it moved (the run's full fits stop further from their optimum
# than this: 8 trust-region evaluations)
PIN_TOLERANCE = 1.0


@dataclass(frozen=True)
class Pinning:
    """A child's constants with the ones the data cannot tell from its seed's at the seed's values."""

    constants: dict[str, float]  # every constant of the child; the pinned ones at the seed's value
    pinned: tuple[str, ...]  # in the order they were put back
    fitted_loss: float  # the train loss at the child's fitted constants
    loss: float  # the train loss at `constants`
    costs: dict[str, float]  # each shared constant put back alone: its train loss minus the fitted one
    tolerance: float = PIN_TOLERANCE

    def to_json(self) -> dict:
        return {
            "constants": self.constants,
            "pinned": list(self.pinned),
            "fitted_loss": self.fitted_loss,
            "loss": self.loss,
            "costs": self.costs,
            "tolerance": self.tolerance,
        }


def shared_constants(program: Program, constants: dict[str, float], seed_constants: dict[str, float]) -> list[str]:
    """The child's constants its seed has too, at another value the child's bounds allow."""
    lo, hi = bound_arrays(program)
    out = []
    for i, name in enumerate(program.constants):
        s = seed_constants.get(name)
        if s is None or not math.isfinite(s) or not lo[i] <= s <= hi[i]:
            continue
        if not math.isclose(s, constants[name], rel_tol=1e-12, abs_tol=0.0):
            out.append(name)
    return out


def pin_to_seed(
    program: Program,
    constants: dict[str, float],
    seed_constants: dict[str, float],
    experiments: list[Experiment],
    pool: ReplayPool,
    config: FitConfig = FitConfig(),
    tolerance: float = PIN_TOLERANCE,
) -> Pinning:
    """Pin the constants of `program` (at its fitted `constants`) that the fit's experiments and split
    cannot tell from its seed's (`seed_constants`, as the seed's own fit left them): 1 + n + m
    closed-loop evaluations for n shared constants of which m cost at most `tolerance` alone."""
    names = list(program.constants)
    fitted = {k: float(constants[k]) for k in names}
    shared = shared_constants(program, fitted, seed_constants)
    exps = fit_experiments(experiments, config)
    compiled = compile_program(program)

    def losses(points: list[dict[str, float]]) -> list[float]:
        vectors = [np.array([p[k] for k in names], dtype=float) for p in points]
        return [finite_loss(v) for v in pool.population_losses(compiled, vectors, exps, config.split, config.objective)]

    base, *alone = losses([fitted, *({**fitted, k: float(seed_constants[k])} for k in shared)])
    put_back = dict(zip(shared, alone))  # each shared constant's train loss put back alone
    costs = {k: float(v - base) for k, v in put_back.items()}
    limit = base * (1 + tolerance / 100)
    cheap = sorted((k for k in shared if put_back[k] <= limit), key=lambda k: (costs[k], k))
    # every prefix of the cheap ones put back together (the first is already measured alone)
    prefixes = [{**fitted, **{k: float(seed_constants[k]) for k in cheap[:n]}} for n in range(1, len(cheap) + 1)]
    together = [put_back[cheap[0]]] + losses(prefixes[1:]) if cheap else []
    kept = max((n for n, v in enumerate(together, 1) if v <= limit), default=0)
    if not kept:
        return Pinning(fitted, (), base, base, costs, tolerance)
    return Pinning(prefixes[kept - 1], tuple(cheap[:kept]), base, together[kept - 1], costs, tolerance)
