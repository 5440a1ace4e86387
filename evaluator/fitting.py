"""CMA-ES fitting of a program's constants against closed-loop replay loss (pycma ask/tell).

Positive constants are searched in log space (a step is a ratio), others linearly with
their magnitude as scale. Each CMA generation's candidates are replayed together on the
engine's pool. Deterministic for a seed whatever the worker count: CMA's random numbers come
from its own seed and every replay is a pure function of (experiment, program, constants).

Fit scope: one constant set for all experiments ("global"), one per model ("model"), or one
per experiment ("experiment"). Quick mode (screening in the search): a subset of experiments
(one per model), a shortened window, a small budget, warm-started with a small step.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

with warnings.catch_warnings():  # pycma warns that matplotlib (plotting only) is absent
    warnings.simplefilter("ignore")
    import cma

from .dsl import Program, compile_program
from .engine import Engine, windowed
from .errors import UserError
from .experiments import Experiment
from .metrics import loss

FAILED_LOSS = 1e5  # loss given to constants whose replay fails (NaN or non-positive step time)
FAILED_REASON = "step_time was non-finite or non-positive for every constant vector tried"
SCOPES = ("global", "model", "experiment")


class FitConfigError(UserError, ValueError):
    """A fit setting out of its range: one line naming it."""


@dataclass(frozen=True)
class FitConfig:
    scope: str = "global"
    seed: int = 0
    max_evals: int | None = None  # per group; default grows with the number of constants
    sigma0: float = 0.5  # initial step (log space: 0.5 ~ a factor of 1.65)
    popsize: int | None = None
    tolfun: float = 1e-3  # stop when the loss (in % points) moves less than this
    split: str = "train"
    window: float | None = None  # score only the first fraction of requests
    experiments: tuple[str, ...] | None = None  # restrict to these experiment names
    restarts: int = 0  # extra CMA-ES runs from the best point so far (fresh step size and seed)

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise FitConfigError(f"scope must be one of {', '.join(SCOPES)}, not {self.scope!r}")


def quick_config(seed: int = 0, experiments: list[Experiment] | None = None) -> FitConfig:
    """Screening fit: one experiment per model, the first 30% of requests, 40 evaluations."""
    names = None
    if experiments:
        best: dict[str, Experiment] = {}
        for e in experiments:
            cur = best.get(e.model)
            score = int((~e.failed).sum()) - 10 * e.n_failed
            if cur is None or score > int((~cur.failed).sum()) - 10 * cur.n_failed:
                best[e.model] = e
        names = tuple(sorted(e.name for e in best.values()))
    return FitConfig(seed=seed, max_evals=40, sigma0=0.15, popsize=8, tolfun=1e-2, window=0.3, experiments=names)


def group_key(exp: Experiment, scope: str) -> str:
    return "all" if scope == "global" else (exp.model if scope == "model" else exp.name)


@dataclass
class FitResult:
    scope: str
    start: dict[str, float]  # the constants the fit started from
    constants: dict[str, dict[str, float]]  # group -> constant name -> value
    groups: dict[str, list[str]]  # group -> experiment names fitted
    loss: float  # fitting-split loss over all fitted experiments, each with its group's constants
    evaluations: int
    iterations: int
    seconds: float
    history: list[tuple[int, float]] = field(default_factory=list)  # (evaluations, best loss)

    def vector_for(self, program: Program, exp: Experiment) -> np.ndarray:
        """Constants for `exp`: its group's fit, or the starting values if its group was not fitted."""
        c = self.constants.get(group_key(exp, self.scope), self.start)
        return np.array([c[k] for k in program.constants], dtype=float)


class _Transform:
    """Maps constants to CMA coordinates: log for positive values, scaled linear otherwise."""

    def __init__(self, x0: np.ndarray):
        self.log = x0 > 0
        self.scale = np.where(self.log, 1.0, np.maximum(np.abs(x0), 1.0))

    def to_cma(self, v: np.ndarray) -> np.ndarray:
        return np.where(self.log, np.log(np.where(self.log, v, 1.0)), v / self.scale)

    def from_cma(self, x: np.ndarray) -> np.ndarray:
        return np.where(self.log, np.exp(np.clip(x, -700, 700)), np.asarray(x) * self.scale)


def group_experiments(experiments: list[Experiment], scope: str) -> dict[str, list[Experiment]]:
    groups: dict[str, list[Experiment]] = {}
    for e in experiments:
        groups.setdefault(group_key(e, scope), []).append(e)
    return groups


ProgressFn = Callable[[str, int, float, int, float], None]  # group, iteration, best loss, evals, evals/s


def fit_experiments(experiments: list[Experiment], config: FitConfig) -> list[Experiment]:
    """The experiments a config scores: its named subset (if any), windowed (if asked)."""
    exps = experiments
    if config.experiments:
        exps = [e for e in exps if e.name in config.experiments] or experiments
    if config.window:
        exps = [windowed(e, config.window) for e in exps]
    return exps


def fit(program: Program, experiments: list[Experiment], engine: Engine, config: FitConfig = FitConfig(),
        start: dict[str, float] | None = None, progress: ProgressFn | None = None) -> FitResult:
    """Fit `program`'s constants; `start` warm-starts from other values (e.g. a parent's)."""
    t0 = time.perf_counter()
    exps = fit_experiments(experiments, config)
    compiled = compile_program(program)
    names = list(program.constants)
    v0 = np.array([(start or {}).get(k, program.constants[k]) for k in names], dtype=float)
    groups = group_experiments(exps, config.scope)
    result = FitResult(config.scope, dict(zip(names, map(float, v0))), {},
                       {g: [e.name for e in es] for g, es in groups.items()}, math.nan, 0, 0, 0.0)
    if not names:  # nothing to fit
        losses = engine.population_losses(compiled, [v0], exps, config.split)
        result.constants = {g: {} for g in groups}
        result.loss, result.evaluations, result.seconds = losses[0], 1, time.perf_counter() - t0
        return result

    tf = _Transform(v0)
    n = len(names)
    max_evals = config.max_evals or (30 + 6 * n) * (config.popsize or 4 + int(3 * math.log(n)))
    all_rows_loss = []
    for gi, (group, gexps) in enumerate(groups.items()):
        def losses_of(X, gexps=gexps):
            return [_safe(v) for v in engine.population_losses(compiled, [tf.from_cma(x) for x in X], gexps, config.split)]

        x0 = tf.to_cma(v0)
        # the starting point itself is the first candidate: a fit never ends worse than its start
        best_x, best_loss = x0, losses_of([x0])[0]
        evals, it = 1, 0
        result.history.append((result.evaluations + evals, best_loss))
        for restart in range(1 + config.restarts):  # each restart: a fresh CMA-ES from the best point so far
            opts = {"seed": (config.seed * 7919 + gi + 104729 * restart) % (2**31 - 2) + 1,
                    "maxfevals": max(1, max_evals - 1),  # the start point is evaluation 1
                    "tolfun": config.tolfun, "tolx": 1e-6, "verbose": -9}
            if config.popsize:
                opts["popsize"] = config.popsize
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                es = cma.CMAEvolutionStrategy(best_x, config.sigma0, opts)
            while not es.stop():
                X = es.ask()
                losses = losses_of(X)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    es.tell(X, losses)
                evals += len(X)
                it += 1
                i = int(np.argmin(losses))
                if losses[i] < best_loss:
                    best_loss, best_x = losses[i], np.array(X[i])
                result.history.append((result.evaluations + evals, best_loss))
                if progress:
                    elapsed = time.perf_counter() - t0
                    progress(group, it, best_loss, result.evaluations + evals, (result.evaluations + evals) / max(elapsed, 1e-9))
        result.evaluations += evals
        result.iterations += it
        best_v = tf.from_cma(best_x)
        result.constants[group] = {k: float(v) for k, v in zip(names, best_v)}
        all_rows_loss.append((len(gexps), best_loss))
    if len(groups) == 1:
        result.loss = all_rows_loss[0][1]
    else:  # the loss over all experiments, each replayed with its group's constants
        rows = engine.score(compiled, [result.vector_for(program, e) for e in exps], (config.split,), exps)
        result.loss = loss(rows[config.split])
    result.seconds = time.perf_counter() - t0
    return result


def _safe(v: float) -> float:
    return v if math.isfinite(v) else FAILED_LOSS
