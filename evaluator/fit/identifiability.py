"""Which fitted constants the data decided, and which their prior (or a bound) holds.

For each constant, the closed-loop loss is profiled a step either side of the fitted value (a
tenth of a log unit, about 10 %, for a constant the fit searches in log space; a tenth of its
scale otherwise) with the others held, and its curvature compared with the prior's over the same
step:
  identified        the data's curvature is at least IDENTIFIED times the prior's (or, without a
                    prior, the loss moves by at least FLAT loss points): the data put it there;
  weak              between: data and prior share the say;
  held by its prior the data's curvature is under WEAK times the prior's: the prior put it there;
  unidentified      no prior, and the loss barely moves: nothing decides it.
A constant on one of its bounds is profiled inward (one-sided), and the table says whether the
data push it past the bound ("held by its bound") or it sits there for the prior or flatness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.dsl import Program, compile_program
from stepml_evolve.evaluator.dsl.program import Prior
from stepml_evolve.evaluator.fit.fitting import Coordinates, FitConfig, bound_arrays, finite_loss, fit_experiments
from stepml_evolve.evaluator.scoring.pool import ReplayPool

STEP = 0.1  # profile step in fit coordinates (log units for a constant searched in log space)
IDENTIFIED = 4.0
WEAK = 0.25
FLAT = 0.05  # loss points: a constant without a prior whose profile moves the loss less is unidentified
VERDICTS = ("identified", "weak", "held by its prior", "unidentified", "held by its bound")


@dataclass(frozen=True)
class ConstantReport:
    name: str
    value: float
    prior: Prior | None
    z: float | None  # spreads from the prior's centre (None: no prior)
    data_curvature: float  # second difference of the loss over the profile's step (loss points; < 0 read as 0)
    prior_curvature: float  # the prior penalty's over the same step
    bound: str | None  # "min" or "max" when the value sits on that bound
    verdict: str
    why: str

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "value": self.value,
            "prior": None if self.prior is None else {"centre": self.prior.centre, "spread": self.prior.spread},
            "z": self.z,
            "data_curvature": self.data_curvature,
            "prior_curvature": self.prior_curvature,
            "bound": self.bound,
            "verdict": self.verdict,
            "why": self.why,
        }


def _on_bound(v: float, lo: float, hi: float) -> str | None:
    tol = 1e-6 * max(abs(v), 1.0)
    if math.isfinite(lo) and v <= lo + tol:
        return "min"
    if math.isfinite(hi) and v >= hi - tol:
        return "max"
    return None


def identify(
    program: Program,
    constants: dict[str, float],
    experiments: list[Experiment],
    pool: ReplayPool,
    config: FitConfig = FitConfig(),
) -> list[ConstantReport]:
    """The identifiability of each of `program`'s constants at `constants` (a fit's result) on the
    experiments and split the fit used: 2 closed-loop evaluations per constant, plus one."""
    names = list(program.constants)
    if not names:
        return []
    exps = fit_experiments(experiments, config)
    v = np.array([constants[k] for k in names], dtype=float)
    lo, hi = bound_arrays(program, config.floor)
    tf = Coordinates(v, lo, hi)
    x = tf.to_cma(v)
    clo, chi = tf.cma_bounds()
    points, plans = [x], []
    for i, name in enumerate(names):
        bound = _on_bound(v[i], lo[i], hi[i])
        step = np.zeros(len(x))
        step[i] = STEP
        if bound == "min" or x[i] - STEP < clo[i]:
            pts, kind = [x + step, x + 2 * step], "up"
        elif bound == "max" or x[i] + STEP > chi[i]:
            pts, kind = [x - step, x - 2 * step], "down"
        else:
            pts, kind = [x - step, x + step], "both"
        plans.append((name, bound, kind, len(points)))
        points += [np.clip(p, clo, chi) for p in pts]
    vectors = [tf.from_cma(p) for p in points]
    compiled = compile_program(program)
    losses = [finite_loss(x) for x in pool.population_losses(compiled, vectors, exps, config.split, config.objective)]
    reports = []
    for name, bound, kind, at in plans:
        i = names.index(name)
        prior = program.priors.get(name)
        a, b = losses[at], losses[at + 1]
        pa, pb = (prior.penalty(vectors[at][i]), prior.penalty(vectors[at + 1][i])) if prior else (0.0, 0.0)
        p0 = prior.penalty(v[i]) if prior else 0.0
        if kind == "both":
            data, pri = a + b - 2 * losses[0], pa + pb - 2 * p0
        else:
            data, pri = losses[0] - 2 * a + b, p0 - 2 * pa + pb
        data, pri = max(float(data), 0.0), max(float(pri), 0.0)
        verdict, why = _verdict(data, pri, prior, bound, slope=a - losses[0], value=v[i], limits=(lo[i], hi[i]))
        z = float(prior.z(v[i])) if prior else None
        reports.append(ConstantReport(name, float(v[i]), prior, z, data, pri, bound, verdict, why))
    return reports


def _verdict(data: float, pri: float, prior: Prior | None, bound: str | None, slope: float, value, limits):
    """(verdict, why) from the profile's curvatures; on a bound, from the slope inward too."""
    if bound:
        limit = limits[0] if bound == "min" else limits[1]
        if slope > 0:  # moving inward costs loss: the data would take it past the bound
            side = "below its min" if bound == "min" else "above its max"
            return VERDICTS[4], f"on its {bound} {limit:g}: the data would take it {side}"
        held = "its prior" if prior and pri > data else "a flat loss"
        return VERDICTS[4], f"on its {bound} {limit:g}, held there by {held}, not by the data"
    if prior is None:
        if data >= FLAT:
            return VERDICTS[0], f"the loss rises {data:.3g} points a step either side"
        return VERDICTS[3], f"the loss moves {data:.3g} points a step either side, and no prior holds it"
    ratio = data / pri if pri > 0 else math.inf
    if ratio >= IDENTIFIED:
        return VERDICTS[0], f"the data's curvature is {ratio:.3g}x the prior's"
    if ratio >= WEAK:
        return VERDICTS[1], f"the data's curvature is {ratio:.2g}x the prior's"
    return VERDICTS[2], f"the data's curvature is {ratio:.2g}x the prior's"
