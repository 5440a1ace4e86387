"""A structure judged by its best fit: one program fitted from several starts, the best kept.

One fit from one start can land far from the structure's best constants (on the real data the
regime_switch seed's held-out loss varied up to 7x between two search seeds' generation-0 fits), and
a search then credits a child that is the same text refitted from a luckier start with a gain it
did not make. `fit_from_starts` fits the program from its own start and from `starts - 1` draws
from its constants' priors (a relative prior: the centre times e to a normal draw of its spread; an
absolute one: the centre plus one; a constant without a prior: its start times e^N(0, 0.3)), each
moved into the bounds and fitted with its own CMA seed, and keeps the fit of the lowest loss plus
penalties, what the fit itself minimizes.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.dsl import Program
from stepml_evolve.evaluator.dsl.program import clip_to
from stepml_evolve.evaluator.fit.config import FitConfig
from stepml_evolve.evaluator.fit.fitting import FitResult, fit_constants
from stepml_evolve.evaluator.scoring.pool import ReplayPool

NO_PRIOR_SPREAD = 0.3  # a constant without a prior is drawn within about 30 % of its start
START_SEED_STEP = 7919  # the k-th start's CMA seed: the fit's seed + k * this


def drawn_start(program: Program, start: dict[str, float], rng: np.random.Generator) -> dict[str, float]:
    """Constants drawn from the priors (around `start` where a constant has none), inside the bounds."""
    out = {}
    for name, value in start.items():
        prior = program.priors.get(name)
        if prior is not None and prior.relative:
            v = prior.centre * math.exp(prior.spread * rng.standard_normal())
        elif prior is not None:
            v = prior.centre + prior.spread * rng.standard_normal()
        else:
            v = value * math.exp(NO_PRIOR_SPREAD * rng.standard_normal()) if value else value
        out[name] = clip_to(v, program.bounds.get(name))
    return out


def total(result: FitResult) -> float:
    """What a fit minimizes: its loss plus the priors' penalties."""
    return result.loss + sum(result.penalties.values())


def fit_from_starts(
    program: Program,
    experiments: list[Experiment],
    pool: ReplayPool,
    config: FitConfig,
    start: dict[str, float],
    starts: int = 1,
    progress=None,
) -> tuple[FitResult, list[FitResult]]:
    """The best of `starts` fits (by loss + penalties; ties: the earlier) and every one of them, in
    order: the first from `start`, the others from prior draws (deterministic for config.seed)."""
    rng = np.random.default_rng([config.seed, 0x5EED])
    results = []
    for k in range(max(1, starts)):
        begin = start if k == 0 else drawn_start(program, start, rng)
        cfg = config if k == 0 else dataclasses.replace(config, seed=config.seed + k * START_SEED_STEP)
        results.append(fit_constants(program, experiments, pool, cfg, start=begin, progress=progress))
    best = min(
        range(len(results)), key=lambda i: (total(results[i]) if math.isfinite(total(results[i])) else math.inf, i)
    )
    return results[best], results
