"""Fitting a program's constants against the closed-loop replay loss.

Two methods, both deterministic for a seed whatever the worker count (CMA's random numbers come
from its own seed and every replay is a pure function of (experiment, program, constants)):

  trust-region (default)  record each experiment's trajectory at the current constants, minimize
      the trajectory surrogate (scoring/surrogate.py: the recorded schedule re-timed, milliseconds per
      CMA-ES population) with CMA-ES inside a box of radius rho around them, and let the
      closed-loop replay judge the surrogate's optimum and `candidates - 1` neighbours: accept
      the best if the true loss fell, grow rho when the surrogate predicted the fall well, shrink
      it when it did not. At most `candidates` closed-loop evaluations per iteration, so a fit
      costs about a tenth of the replays plain CMA-ES spends (91 against 1123 for trained_physics
      on the real data; docs/HISTORY.md).
  cmaes  plain CMA-ES on the closed-loop loss (pycma ask/tell), each generation's candidates
      replayed together on the pool. Used where no surrogate can be recorded (the
      starting constants fail to replay).

Positive constants are searched in log space (a step is a ratio), others linearly with their
magnitude as scale; rho and CMA's step size are in these coordinates.

Bounded constants (`{"start": s, "min": lo, "max": hi}` in the program, `Program.bounds`): the
start (the program's values or a warm `start=`) is first moved into the bounds; the bounds are
mapped into CMA coordinates (log(min), or -inf when min is 0, log(max) in log space; min/scale,
max/scale linearly; a constant whose min is negative is searched linearly, since log space cannot
cross zero) and handed to pycma's own bound handling (`bounds` option, BoundTransform): plain
CMA-ES gets them as its box, the trust region intersects its box of radius rho with them, and the
neighbours it judges are clipped to that intersection. Values read back from CMA coordinates are
clipped to the bounds only to absorb the last-bit rounding of exp(log(x)). A program without
bounds takes exactly the code path, and gets exactly the fit, it had before bounds existed.

What a fit minimizes: the objective's loss on the closed loop (or its surrogate) plus two
penalties, so that what the data cannot decide is decided by physics:
  * the priors (`Program.priors`): PRIOR_WEIGHT loss points per squared spread a constant strays
    from its prior's centre; `FitResult.loss` is the objective alone, `FitResult.penalties` the
    priors' part at the result;
  * the floor (floor.py, `FitConfig.floor`): constants that put step_time below the roofline of a
    step's work at peak anywhere in the envelope cost FLOOR_LOSS and more the further below, so a
    fit that starts at or above the floor never ends below it (a start below it is no physics, a
    regression such as BLIS's blackbox: it is fitted without the floor, as `--physics off` fits).

Fit scope: one constant set for all experiments ("global"), one per model ("model"), or one
per experiment ("experiment"). Quick mode (screening in the search): a subset of experiments
(one per model), a shortened window, a small budget, warm-started with a small step.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

with warnings.catch_warnings():  # pycma warns that matplotlib (plotting only) is absent
    warnings.simplefilter("ignore")
    import cma

from stepml_evolve.evaluator.choices import METHODS
from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.dsl import Program, compile_program
from stepml_evolve.evaluator.dsl.linearity import linear_constants
from stepml_evolve.evaluator.dsl.program import prior_penalty
from stepml_evolve.evaluator.fit.config import QUICK_EVALS, QUICK_WINDOW, FitConfig, ProgressFn
from stepml_evolve.evaluator.fit.linear_solve import LinearSolve, solvable
from stepml_evolve.evaluator.physics.floor import Envelope, below_floor, check_floor, envelope_for
from stepml_evolve.evaluator.physics.rules import held_bounds
from stepml_evolve.evaluator.scoring.metrics import MetricRow
from stepml_evolve.evaluator.scoring.pool import ReplayPool, windowed
from stepml_evolve.evaluator.scoring.surrogate import (
    PendingModel,
    SurrogateSet,
    TrajectoryModel,
    VectorProgram,
    learn_gain,
    shift_us,
)
from stepml_evolve.evaluator.seeding import cma_seed

Recording = tuple[MetricRow, "TrajectoryModel | PendingModel | None"]  # one experiment's closed loop at some constants

FLOOR_LOSS = 1e4  # loss of constants below the floor (plus as much again per unit of shortfall): infeasible
FAILED_LOSS = 1e5  # loss given to constants whose replay fails (a duration NaN, non-positive or over replay.MAX_US)
FAILED_REASON = "step_time was non-finite, non-positive or over 1e15 us for every constant vector tried"


def quick_config(seed: int = 0, experiments: list[Experiment] | None = None, method: str = METHODS[0]) -> FitConfig:
    """Screening fit: one experiment per model, the first 30% of requests (QUICK_WINDOW), a small budget (QUICK_EVALS)."""
    names = None
    if experiments:
        best: dict[str, Experiment] = {}
        for e in experiments:
            cur = best.get(e.model)
            score = int((~e.failed).sum()) - 10 * e.n_failed
            if cur is None or score > int((~cur.failed).sum()) - 10 * cur.n_failed:
                best[e.model] = e
        names = tuple(sorted(e.name for e in best.values()))
    return FitConfig(
        seed=seed,
        max_evals=QUICK_EVALS[method],
        sigma0=0.15,
        popsize=8,
        tolfun=1e-2,
        window=QUICK_WINDOW,
        experiments=names,
        method=method,
        candidates=1,
        stall_points=5,  # five iterations: a screening fit stops early
    )


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
    history: list[tuple[int, float]] = field(default_factory=list)  # (evaluations, best loss + penalties)
    penalties: dict[str, float] = field(default_factory=dict)  # group -> the priors' penalty at its constants
    notes: dict[str, int] = field(default_factory=dict)  # what the fit did instead of what it was asked -> times
    # a global trust-region fit's closed loop at its result, per experiment: its metric row and
    # trajectory model (what a warm-started fit on a subset needs to skip its start's replays)
    recorded: dict[str, Recording] | None = field(default=None, repr=False)

    def vector_for(self, program: Program, exp: Experiment) -> np.ndarray:
        """Constants for `exp`: its group's fit, or the starting values if its group was not fitted."""
        c = self.constants.get(group_key(exp, self.scope), self.start)
        return np.array([c[k] for k in program.constants], dtype=float)


class Coordinates:
    """Maps constants to CMA coordinates: log for positive values (unless their lower bound is
    negative), scaled linear otherwise. `lo`/`hi` are the constants' bounds (+-inf where open);
    `x0` must lie inside them."""

    def __init__(self, x0: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None):
        self.lo = np.full(len(x0), -np.inf) if lo is None else np.asarray(lo, dtype=float)
        self.hi = np.full(len(x0), np.inf) if hi is None else np.asarray(hi, dtype=float)
        self.bounded = bool(np.isfinite(self.lo).any() or np.isfinite(self.hi).any())
        self.log = (x0 > 0) & ((self.lo >= 0) | np.isneginf(self.lo))
        self.scale = np.where(self.log, 1.0, np.maximum(np.abs(x0), 1.0))

    def to_cma(self, v: np.ndarray) -> np.ndarray:
        return np.where(self.log, np.log(np.where(self.log, v, 1.0)), v / self.scale)

    def from_cma(self, x: np.ndarray) -> np.ndarray:
        v = np.where(self.log, np.exp(np.clip(x, -700, 700)), np.asarray(x) * self.scale)
        return np.clip(v, self.lo, self.hi) if self.bounded else v  # exp(log(min)) may miss min by an ulp

    def cma_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The bounds in CMA coordinates (+-inf where open; log(0) is -inf)."""
        pos_lo = np.where(self.lo > 0, self.lo, 1.0)
        pos_hi = np.where(self.hi > 0, self.hi, 1.0)
        lo = np.where(self.log, np.where(self.lo > 0, np.log(pos_lo), -np.inf), self.lo / self.scale)
        hi = np.where(self.log, np.log(pos_hi), self.hi / self.scale)  # in log space hi >= x0 > 0
        return lo, hi


def bound_arrays(program: Program, physics: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of the program's constants, in their order (+-inf where open).
    physics: as --physics check holds them (rules.held_bounds: a min of 0 where a value reads a
    constant that has none)."""
    bounds = held_bounds(program) if physics else program.bounds
    b = [bounds.get(k, (-math.inf, math.inf)) for k in program.constants]
    return np.array([x[0] for x in b], dtype=float), np.array([x[1] for x in b], dtype=float)


def group_experiments(experiments: list[Experiment], scope: str) -> dict[str, list[Experiment]]:
    groups: dict[str, list[Experiment]] = {}
    for e in experiments:
        groups.setdefault(group_key(e, scope), []).append(e)
    return groups


def fit_experiments(experiments: list[Experiment], config: FitConfig) -> list[Experiment]:
    """The experiments a config scores: its named subset (if any), windowed (if asked)."""
    exps = experiments
    if config.experiments:
        exps = [e for e in exps if e.name in config.experiments] or experiments
    if config.window:
        exps = [windowed(e, config.window) for e in exps]
    return exps


def fit_constants(
    program: Program,
    experiments: list[Experiment],
    pool: ReplayPool,
    config: FitConfig = FitConfig(),
    start: dict[str, float] | None = None,
    progress: ProgressFn | None = None,
    recorded_start: dict[str, Recording] | None = None,
) -> FitResult:
    """Fit `program`'s constants; `start` warm-starts from other values (e.g. a parent's), moved
    into the program's bounds first. Every fitted value lies inside its constant's bounds.
    `recorded_start`: the closed loop already replayed at `start` (another fit's `recorded`, same
    split); a trust-region fit then starts from it instead of replaying, and counts no evaluation
    for its start."""
    t0 = time.perf_counter()
    exps = fit_experiments(experiments, config)
    compiled = compile_program(program)
    names = list(program.constants)
    v0 = np.array([(start or {}).get(k, program.constants[k]) for k in names], dtype=float)
    lo, hi = bound_arrays(program, config.floor)
    if np.isfinite(lo).any() or np.isfinite(hi).any():  # a start inside the bounds (a parent's may lie outside)
        v0 = np.clip(v0, lo, hi)
    groups = group_experiments(exps, config.scope)
    result = FitResult(
        config.scope,
        dict(zip(names, map(float, v0))),
        {},
        {g: [e.name for e in es] for g, es in groups.items()},
        math.nan,
        0,
        0,
        0.0,
    )
    if not names:  # nothing to fit
        losses = pool.population_losses(compiled, [v0], exps, config.split, config.objective)
        result.constants = {g: {} for g in groups}
        result.loss, result.evaluations, result.seconds = losses[0], 1, time.perf_counter() - t0
        return result

    env = envelope_for(experiments) if config.floor else None
    if env is not None and not check_floor(program, v0, env).ok:
        env = None  # a start below the floor is no physics (BLIS's blackbox): fitted as it is, as with floor off
    group_fit = _GroupFit(program, compiled, pool, config, Coordinates(v0, lo, hi), result, t0, progress, env)
    all_rows_loss = []
    for gi, (group, gexps) in enumerate(groups.items()):
        known = [recorded_start.get(e.name) for e in gexps] if recorded_start else []
        ready = _copies(known) if known and all(r is not None for r in known) else None
        best_x, best_total = group_fit.run(gi, group, gexps, group_fit.tf.to_cma(v0), ready)
        best_v = group_fit.tf.from_cma(best_x)
        result.constants[group] = {k: float(v) for k, v in zip(names, best_v)}
        result.penalties[group] = float(prior_penalty(program, best_v)[0])
        all_rows_loss.append((len(gexps), best_total - group_fit.penalty([best_x])[0]))
    if len(groups) == 1:
        result.loss = all_rows_loss[0][1]
    else:  # the loss over all experiments, each replayed with its group's constants
        rows = pool.score(compiled, [result.vector_for(program, e) for e in exps], (config.split,), exps)
        result.loss = config.objective.of_rows(rows[config.split])
    result.seconds = time.perf_counter() - t0
    return result


def _quiet_cma(x0, sigma0, opts) -> cma.CMAEvolutionStrategy | _OneDimension:
    """A CMA-ES with its own random stream: with its default sampler pycma seeds and draws from
    numpy's global generator, so fits running at the same time (cross-validation folds) would
    take each other's numbers and no longer be a function of their seed. A program with one
    constant gets a second, ignored coordinate (pycma does not run in one dimension)."""
    opts = dict(opts)
    rng = np.random.default_rng(opts.pop("seed"))
    opts["randn"] = lambda *shape: rng.standard_normal(shape)
    one = len(x0) == 1
    if one:
        x0 = np.append(x0, 0.0)
        if "bounds" in opts:
            opts["bounds"] = [list(opts["bounds"][0]) + [-1.0], list(opts["bounds"][1]) + [1.0]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        es = cma.CMAEvolutionStrategy(x0, sigma0, opts)
    return _OneDimension(es) if one else es


class _OneDimension:
    """A two-dimensional CMA-ES seen through its first coordinate: what it asks for is cut to it,
    and what is told back is the full points it asked for last."""

    def __init__(self, es: cma.CMAEvolutionStrategy):
        self.es, self.asked = es, []

    def stop(self):
        return self.es.stop()

    def ask(self, number=None):
        asked = self.es.ask() if number is None else self.es.ask(number)
        if number is None:
            self.asked = asked
        return [np.asarray(x)[:1] for x in asked]

    def tell(self, X, values):
        self.es.tell(self.asked, values)


def _tell(es, X, losses) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        es.tell(X, losses)


class _GroupFit:
    """Fits one group's constants (in CMA coordinates) with the configured method, counting
    closed-loop evaluations, iterations and history into the shared result."""

    def __init__(
        self,
        program,
        compiled,
        pool,
        config: FitConfig,
        tf: Coordinates,
        result: FitResult,
        t0: float,
        progress: ProgressFn | None,
        env: Envelope | None = None,
    ):
        self.program, self.compiled, self.pool, self.cfg, self.tf = program, compiled, pool, config, tf
        self.env = env
        self.lo, self.hi = tf.cma_bounds()  # the constants' bounds in CMA coordinates
        self.result, self.t0, self.progress = result, t0, progress
        n = len(program.constants)
        self.n = n
        cmaes_budget = (30 + 6 * n) * (config.popsize or 4 + int(3 * math.log(n)))
        # the trust region's default: a tenth of the closed-loop replays CMA-ES spends by default
        self.max_evals = config.max_evals or (cmaes_budget if config.method == "cmaes" else max(8, cmaes_budget // 10))
        self.vector = VectorProgram.of(program) if config.method == "trust-region" else None
        linear = set(linear_constants(program)) if config.linear_solve and solvable(config.objective) else set()
        self.linear = np.array([i for i, k in enumerate(program.constants) if k in linear], dtype=np.int64)
        self.nonlinear = np.array([i for i, k in enumerate(program.constants) if k not in linear], dtype=np.int64)

    def penalty(self, X) -> np.ndarray:
        """The priors' penalty plus the floor's of points X (CMA coordinates)."""
        V = np.array([self.tf.from_cma(x) for x in X], dtype=float)
        total = prior_penalty(self.program, V)
        if self.env is not None:
            short = below_floor(self.program, V, self.env)
            total = total + np.where(short > 0, np.minimum(FLOOR_LOSS * (1.0 + short), FAILED_LOSS), 0.0)
        return total

    def losses(self, X, gexps) -> list[float]:
        pop = [self.tf.from_cma(x) for x in X]
        data = self.pool.population_losses(self.compiled, pop, gexps, self.cfg.split, self.cfg.objective)
        return [finite_loss(v) + p for v, p in zip(data, self.penalty(X))]

    def note(self, group: str, it: int, evals: int, best_loss: float) -> None:
        self.result.history.append((self.result.evaluations + evals, best_loss))
        if self.progress:
            done = self.result.evaluations + evals
            self.progress(group, it, best_loss, done, done / max(time.perf_counter() - self.t0, 1e-9))

    def run(
        self, gi: int, group: str, gexps: list[Experiment], x0: np.ndarray, known: list[Recording] | None = None
    ) -> tuple[np.ndarray, float]:
        evals, it = 1, 0
        if self.cfg.method == "trust-region":  # the start's closed loop, replayed unless known
            best_loss, models, rows = self.judged(x0, known) if known is not None else self.judge(x0, gexps)
            models = _built(models)
            evals = 0 if known is not None else 1
        else:
            best_loss, models = self.losses([x0], gexps)[0], None
        best_x = x0
        self.note(group, 0, evals, best_loss)  # a fit never ends worse than its start
        if models is None:  # plain CMA-ES: asked for, or no surrogate where the start fails to replay
            best_x, best_loss, evals, it = self.cmaes(gi, group, gexps, best_x, best_loss, evals, it)
        else:
            start_cost = evals
            for restart in range(1 + self.cfg.restarts):  # each restart: a fresh region around the best point
                best_x, best_loss, models, rows, evals, it = self.trust_region(
                    gi, group, gexps, best_x, best_loss, models, rows, evals, it, restart, start_cost
                )
            if self.cfg.scope == "global":
                self.result.recorded = {e.name: (row, m) for e, row, m in zip(gexps, rows, models)}
        self.result.evaluations += evals
        self.result.iterations += it
        return best_x, best_loss

    def cmaes(self, gi, group, gexps, best_x, best_loss, evals, it):
        for restart in range(1 + self.cfg.restarts):  # each restart: a fresh CMA-ES from the best point so far
            opts = {
                "seed": cma_seed(self.cfg.seed, gi, restart),
                "maxfevals": max(1, self.max_evals - 1),  # the start point is evaluation 1
                "tolfun": self.cfg.tolfun,
                "tolx": 1e-6,
                "verbose": -9,
            }
            if self.cfg.popsize:
                opts["popsize"] = self.cfg.popsize
            if self.tf.bounded:  # pycma's bound handling (BoundTransform): every candidate asked is inside
                opts["bounds"] = [list(self.lo), list(self.hi)]
            es = _quiet_cma(best_x, self.cfg.sigma0, opts)
            while not es.stop():
                X = es.ask()
                losses = self.losses(X, gexps)
                _tell(es, X, losses)
                evals += len(X)
                it += 1
                i = int(np.argmin(losses))
                if losses[i] < best_loss:
                    best_loss, best_x = losses[i], np.array(X[i])
                self.note(group, it, evals, best_loss)
        return best_x, best_loss, evals, it

    def judge(self, x, gexps):
        """Closed-loop loss (plus penalties) at x and the trajectory models recorded there (None if any failed)."""
        return self.judged(x, self.pool.record(self.compiled, self.vector, self.tf.from_cma(x), gexps, self.cfg.split))

    def judged(self, x, recorded: list[Recording]):
        """judge's answer (loss plus penalties, models or None, rows) from the closed loop's recordings at x."""
        rows = [row for row, _ in recorded]
        models = [m for _, m in recorded]
        loss = finite_loss(self.cfg.objective.of_rows(rows)) + self.penalty([x])[0]
        return loss, (None if any(m is None for m in models) else models), rows

    def surrogate_losses(self, X, surrogate: SurrogateSet) -> list[float]:
        e2e, ttft = surrogate.apes(np.array([self.tf.from_cma(x) for x in X]))
        data = self.cfg.objective.of_apes([m.name for m in surrogate.models], e2e, ttft)
        return [finite_loss(v) + p for v, p in zip(data, self.penalty(X))]

    def trust_region(self, gi, group, gexps, x, fx, models, rows, evals, it, restart, start_cost=1):
        """Surrogate optimum in a box around the incumbent (x, its loss fx, trajectory models and
        metric rows), judged by the closed loop (see top); at most max_evals closed-loop evaluations
        from `evals` on, the start's own (start_cost) included; a restart gets a fresh budget."""
        cfg = self.cfg
        x = np.array(x, dtype=float)
        budget_end = evals + self.max_evals - (start_cost if restart == 0 else 0)
        rho = RHO_START * cfg.sigma0 / 0.5
        stalled = 0  # judged points (an iteration's candidates) since the last gain of at least tolfun
        sur_budget = cfg.surrogate_evals or 200 + 40 * self.n
        while evals < budget_end and rho > RHO_MIN:
            it += 1
            lo, hi = np.maximum(x - rho, self.lo), np.minimum(x + rho, self.hi)  # the region within the bounds
            # the surrogate's CMA-ES: its group and iteration take the second and third part weights
            opts = {
                "seed": cma_seed(cfg.seed + 7 * restart, 0, gi, it),
                "maxfevals": sur_budget,
                "tolfun": cfg.tolfun * 0.1,
                "tolx": 1e-4 * rho,
                "verbose": -9,
            }
            if cfg.popsize:
                opts["popsize"] = cfg.popsize
            surrogate = SurrogateSet(models, self.vector)
            if len(self.linear):
                best_y, best_m, m_x, es = self.projected_step(x, rho, lo, hi, surrogate, opts)
            else:
                best_y, best_m, m_x, es = self.sampled_step(x, rho, lo, hi, surrogate, opts)
            predicted = m_x - best_m
            if predicted <= cfg.tolfun * 0.1:  # the surrogate sees nothing to gain here: look closer
                rho *= SHRINK
                stalled += cfg.candidates
                if stalled >= cfg.stall_points:
                    break
                continue
            fy, models_y, rows_y = self.judge(best_y, gexps)
            evals += 1
            # other points of the surrogate's final search distribution: the closed loop is rugged
            # at small scales (a batch forms one step earlier or later), so a few neighbours of the
            # surrogate's optimum are judged too and the best of them is the step taken
            extra = self.neighbours(es, best_y, rho, lo, hi, cma_seed(cfg.seed + 7 * restart, 1, gi, it))
            for y in extra:
                if evals >= budget_end:
                    break
                f2, m2, r2 = self.judge(y, gexps)
                evals += 1
                if f2 < fy:
                    best_y, fy, models_y, rows_y = y, f2, m2, r2
            if models_y is not None:  # what the closed loop did vs what the surrogate said, for the gains
                for mx, my in zip(models, models_y):
                    if mx.n_ok:
                        shift = shift_us(mx, self.vector, self.tf.from_cma(best_y)[None, :])[0][0]
                        mx.gain = my.gain = learn_gain(mx, shift, my.recorded_us - mx.recorded_us)
            ratio = (fx - fy) / predicted
            step = float(np.max(np.abs(best_y - x)))
            if fy < fx:
                stalled = stalled + cfg.candidates if fx - fy < cfg.tolfun else 0
                x, fx, rows = best_y, fy, rows_y
                models = _built(models_y) if models_y is not None else models
            else:
                stalled += cfg.candidates
            if ratio >= 0.75 and step >= 0.5 * rho:
                rho = min(rho * GROW, RHO_MAX)
            elif ratio < 0.25:
                rho = max(min(rho, step), RHO_MIN) * SHRINK
            self.note(group, it, evals, fx)
            if stalled >= cfg.stall_points:
                break
        return x, fx, models, rows, evals, it

    def sampled_step(self, x, rho, lo, hi, surrogate, opts):
        """The surrogate's optimum in the box [lo, hi] by CMA-ES over every constant: (its point,
        its surrogate loss, the surrogate loss at x, the CMA-ES)."""
        es = _quiet_cma(x, rho / 2, {**opts, "bounds": [list(lo), list(hi)]})
        best_y, best_m = x, self.surrogate_losses([x], surrogate)[0]  # = fx up to class rounding
        m_x = best_m
        while not es.stop():
            Y = es.ask()
            values = self.surrogate_losses(Y, surrogate)
            _tell(es, Y, values)
            i = int(np.argmin(values))
            if values[i] < best_m:
                best_y, best_m = np.array(Y[i]), values[i]
        return best_y, best_m, m_x, es

    def projected_step(self, x, rho, lo, hi, surrogate, opts):
        """sampled_step with the linear constants solved by least squares (variable projection,
        linear_solve.py), by block: solve them at x, then CMA-ES over the others with them held,
        solved again at each new best point and held there from then on (so two constants that
        trade off, one linear and one not, move together along their valley). CMA-ES gets as
        large a share of the budget as the others' share of the constants. A fully linear
        program's step is one solve (n + 1 surrogate vectors)."""
        names = list(self.program.constants)
        solver = LinearSolve(
            surrogate,
            self.cfg.objective,
            self.linear,
            [self.program.priors.get(names[j]) for j in self.linear],
            [names[j] for j in self.linear],
        )
        vlo, vhi = self.tf.from_cma(lo), self.tf.from_cma(hi)

        def project(y):
            v = solver.solve(self.tf.from_cma(y)[None, :], vlo, vhi)[0]
            z = np.clip(self.tf.to_cma(v), lo, hi)
            return z, self.surrogate_losses([z], surrogate)[0]

        y, m = project(x)
        if solver.reason:  # no closed form here: this step samples every constant, as without --linear solve
            note = f"linear solve: {solver.reason}; sampled instead"
            self.result.notes[note] = self.result.notes.get(note, 0) + 1
            return self.sampled_step(x, rho, lo, hi, surrogate, opts)
        m_x = self.surrogate_losses([x], surrogate)[0]
        best_y, best_m = x, m_x
        if m < best_m:
            best_y, best_m = y, m
        es = None
        N = self.nonlinear
        if len(N):
            budget = max(PROJECTED_MIN_EVALS, opts["maxfevals"] * len(N) // self.n)
            es = _Held(
                _quiet_cma(best_y[N], rho / 2, {**opts, "maxfevals": budget, "bounds": [list(lo[N]), list(hi[N])]}),
                best_y,
                N,
            )
            while not es.stop():
                Y = es.ask()
                values = self.surrogate_losses(Y, surrogate)
                es.tell(values)
                i = int(np.argmin(values))
                if values[i] < best_m:
                    best_y, best_m = np.array(Y[i]), values[i]
                    y, m = project(best_y)
                    if m < best_m:
                        best_y, best_m = y, m
                    es.held = best_y
        return best_y, best_m, m_x, es

    def neighbours(self, es, best_y, rho, lo, hi, seed):
        """`candidates - 1` other points to judge beside the surrogate's optimum: from the step's
        final search distribution, or (a fully linear program's solve has none) around the optimum."""
        k = max(0, self.cfg.candidates - 1)
        if k == 0:
            return []
        if es is not None:
            return [np.clip(np.array(y), lo, hi) for y in es.ask(k)]
        rng = np.random.default_rng(seed)
        return [np.clip(best_y + rng.normal(0.0, rho / 4, len(best_y)), lo, hi) for _ in range(k)]


class _Held:
    """A CMA-ES over some constants (`index`) seen as one over all: the points it asks for are
    `held` with its coordinates in place."""

    def __init__(self, es, held, index):
        self.es, self.held, self.index = es, held, index

    def stop(self):
        return self.es.stop()

    def ask(self, number=None):
        Z = self.es.ask() if number is None else self.es.ask(number)
        Y = np.repeat(self.held[None, :], len(Z), axis=0)
        Y[:, self.index] = np.array(Z)
        if number is None:
            self.asked = Z
        return list(Y)

    def tell(self, values):
        _tell(self.es, self.asked, values)


PROJECTED_MIN_EVALS = 12  # the smallest surrogate budget of a projected step's CMA-ES over the nonlinear constants

# trust-region settings in CMA coordinates (log units for positive constants: 1.0 = a factor e)
RHO_START = 1.0
RHO_MIN = 0.01
RHO_MAX = 1.0
GROW = 2.0
SHRINK = 0.5


def _built(models: list | None) -> list[TrajectoryModel] | None:
    """The trust region's incumbent models, built (a judged point's are built only if accepted)."""
    return None if models is None else [m.model() if isinstance(m, PendingModel) else m for m in models]


def _copies(known: list[Recording]) -> list[Recording]:
    """The recordings as a fresh replay at their constants gives them: each model a copy whose gain
    is a new recording's (ones, not what the fit they come from learned, see learn_gain), since
    the trust region sets its models' gains while other fits may start from the same recordings."""
    return [(row, None if m is None else dataclasses.replace(m, gain=np.ones(2))) for row, m in known]


def finite_loss(v: float) -> float:
    return v if math.isfinite(v) else FAILED_LOSS
