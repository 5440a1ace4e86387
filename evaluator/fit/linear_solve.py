"""Variable projection for the trust region's surrogate step: the constants a program is affine in
(dsl/linearity.py) solved by bounded least squares for given values of the others.

On a recorded schedule the surrogate's mean E2E and TTFT of each experiment are affine in those
constants (evaluator/scoring/surrogate.py), so each signed error in percent is a + B u, with u the constants
scaled to [0, 1] over the trust region's box. The objective "rms" is RMS(E2E errors) + RMS(TTFT
errors) over experiments (weighted by the experiment weights): not one least-squares problem,
but at any point its gradient is that of the sum of squares with the E2E rows weighted by
1/RMS(E2E) and the TTFT rows by 1/RMS(TTFT), so a few reweighted bounded solves (IRLS, scipy's
lsq_linear) reach its optimum in the box. "worst3" is not a sum of squares: it keeps plain CMA-ES.

Priors (`Program.priors`) enter as ridge rows: PRIOR_WEIGHT z**2 is a square already, z affine in a
constant with an absolute prior and, for a relative one (z in ln units), linearized at the current
value each round; so the solve minimizes the fit's own loss (objective + priors), and a constant
the data cannot decide stays at its prior instead of going wherever the surrogate's noise sends it.

The map is measured, not derived: the surrogate's means at the box's low corner of the linear
constants and with each of them at its high end (n + 1 vectors of one population). Clipping (a
step time below 1 us, a negative delay) makes it only nearly affine; the caller scores the
solution with the surrogate itself, and the closed loop judges it as it judges any surrogate step.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import lsq_linear

from stepml_evolve.evaluator.dsl.program import PRIOR_WEIGHT, Prior
from stepml_evolve.evaluator.scoring.objectives import Objective
from stepml_evolve.evaluator.scoring.surrogate import SurrogateSet

IRLS_ROUNDS = 5  # reweighted solves at most; they stop sooner once the loss moves less than IRLS_TOL
IRLS_TOL = 1e-4  # percent points


def solvable(objective: Objective) -> bool:
    """Whether the objective is a sum of RMS terms the reweighted least squares minimizes."""
    return objective.name == "rms"


class LinearSolve:
    """The best values of the constants at `index` (positions in a constant vector) on one
    surrogate, for given values of the other constants; `priors`: each one's prior (or None)."""

    def __init__(
        self,
        surrogate: SurrogateSet,
        objective: Objective,
        index: np.ndarray,
        priors: list[Prior | None] | None = None,
        names: list[str] | None = None,
    ):
        self.surrogate, self.index = surrogate, np.asarray(index, dtype=np.int64)
        self.priors = list(priors) if priors is not None else [None] * len(self.index)
        self.names = list(names) if names is not None else [f"#{j}" for j in self.index]
        # why the last vector solve() was asked for could not be solved (None: it could): a map that
        # is not finite, or singular (constants that move the means along fewer directions than
        # their number, with no prior to tell them apart); that vector keeps its values
        self.reason: str | None = None
        models = surrogate.models
        self.observed = np.array([m.observed_us for m in models], dtype=float).reshape(len(models), 2)
        live = np.zeros(len(models), bool)
        live[surrogate.live] = True
        # the rows each RMS runs over: live models with a measured mean, per metric
        self.rows = live[:, None] & np.isfinite(self.observed) & (self.observed > 0)
        self.weight = np.array([objective.weight(m.name) for m in models], dtype=float)

    def solve(self, base: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """(P, K) constant vectors: `base` with its linear constants replaced by their best values
        within [lo, hi] (value space). A vector whose map cannot be measured (a replay that would
        fail at a corner of the box) keeps its values."""
        base = np.atleast_2d(np.asarray(base, dtype=float))
        p, k = base.shape
        idx, n = self.index, len(self.index)
        out = base.copy()
        self.reason = None
        if n == 0 or not self.rows.any():
            return out
        width = hi[idx] - lo[idx]
        points = np.repeat(base[:, None, :], n + 1, axis=1)
        points[:, :, idx] = lo[idx]
        points[:, np.arange(1, n + 1), idx] = hi[idx]
        means, ok = self.surrogate.means(points.reshape(-1, k))
        means = means.reshape(p, n + 1, *self.observed.shape)
        ok = ok.reshape(p, n + 1, -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            errors = (means - self.observed) / self.observed * 100.0  # (P, n + 1, E, 2)
        for i in range(p):
            if not ok[i][:, np.any(self.rows, axis=1)].all():
                continue
            slopes = errors[i, 1:] - errors[i, :1]  # (n, E, 2): per unit of u
            u = np.clip((base[i, idx] - lo[idx]) / np.where(width > 0, width, 1.0), 0.0, 1.0)
            # a constant that moves no mean (its effect cancels, or its box is a point) keeps its value
            moves = np.any(slopes[:, self.rows] != 0.0, axis=1) & (width > 0)
            if not moves.any():
                continue
            a = errors[i, 0] + np.tensordot(u[~moves], slopes[~moves], axes=1)  # with the others held
            if reason := self._unsolvable(a, slopes[moves], np.flatnonzero(moves)):
                self.reason = reason
                continue
            ridge = _Ridge([self.priors[j] for j in np.flatnonzero(moves)], lo[idx][moves], width[moves])
            u[moves] = self._reweighted(a, slopes[moves], u[moves], ridge)
            out[i, idx] = lo[idx] + u * width
        return out

    def _unsolvable(self, a: np.ndarray, slopes: np.ndarray, moving: np.ndarray) -> str | None:
        """Why the moving constants (positions in `index`, `slopes` their rows) have no one best value
        on this map, or None: a map that is not finite (lsq_linear refuses it), or singular."""
        data = slopes[:, self.rows].T  # (rows, moving)
        if not (np.isfinite(data).all() and np.isfinite(a[self.rows]).all()):
            return "the surrogate's means are not finite in the box"
        priored = np.eye(len(moving))[[self.priors[j] is not None for j in moving]]
        rank = np.linalg.matrix_rank(np.vstack([data, priored]))
        if rank < len(moving):
            names = ", ".join(self.names[j] for j in moving)
            return f"singular: {names} move the means along {rank} direction(s) (no prior tells them apart)"
        return None

    def _reweighted(self, a: np.ndarray, slopes: np.ndarray, u: np.ndarray, ridge: _Ridge) -> np.ndarray:
        """u in [0, 1]^n minimizing the sum over metrics of the weighted RMS of a + slopes . u, plus
        the priors' penalty (IRLS: each round's squares have the loss's gradient at its start)."""
        metrics = [np.flatnonzero(self.rows[:, m]) for m in range(2)]
        loss = self._loss(a, slopes, u, metrics) + ridge.penalty(u)
        for _ in range(IRLS_ROUNDS):
            blocks, targets = [], []
            for m, rows in enumerate(metrics):
                if not len(rows):
                    continue
                w = self.weight[rows]
                r = a[rows, m] + slopes[:, rows, m].T @ u
                level = max(float(np.sqrt(np.sum(w * r * r) / np.sum(w))), 1e-9)
                scale = np.sqrt(w / (np.sum(w) * level))[:, None]
                blocks.append(scale * slopes[:, rows, m].T)
                targets.append(-scale[:, 0] * a[rows, m])
            rows_, rhs = ridge.rows(u)
            blocks.append(rows_)
            targets.append(rhs)
            solved = lsq_linear(np.vstack(blocks), np.concatenate(targets), bounds=(0.0, 1.0), method="bvls").x
            new = self._loss(a, slopes, solved, metrics) + ridge.penalty(solved)
            if new > loss - IRLS_TOL:
                if new < loss:
                    u = solved
                break
            u, loss = solved, new
        return u

    def _loss(self, a: np.ndarray, slopes: np.ndarray, u: np.ndarray, metrics: list[np.ndarray]) -> float:
        total = 0.0
        for m, rows in enumerate(metrics):
            if len(rows):
                w = self.weight[rows]
                r = a[rows, m] + slopes[:, rows, m].T @ u
                total += float(np.sqrt(np.sum(w * r * r) / np.sum(w)))
        return total


class _Ridge:
    """The priors of the solved constants as least-squares rows in u (value = lo + u * width).
    The data rows' squares have twice the RMS loss's gradient, so each prior row is
    sqrt(2 PRIOR_WEIGHT) z: its square has twice the penalty's."""

    def __init__(self, priors: list[Prior | None], lo: np.ndarray, width: np.ndarray):
        self.priors, self.lo, self.width = priors, np.asarray(lo, float), np.asarray(width, float)
        self.weight = math.sqrt(2.0 * PRIOR_WEIGHT)

    def rows(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(R, n) rows and (R,) targets: z of each prior, affine in u (a relative prior's ln
        linearized at the value u gives)."""
        n = len(u)
        rows, rhs = [], []
        for j, prior in enumerate(self.priors):
            if prior is None:
                continue
            row = np.zeros(n)
            if prior.relative:
                v0 = max(self.lo[j] + u[j] * self.width[j], 1e-12)
                # z ~ (ln v0 - ln c + (v - v0) / v0) / s, v = lo + u w
                row[j] = self.width[j] / (v0 * prior.spread)
                target = -(math.log(v0) - math.log(prior.centre) + (self.lo[j] - v0) / v0) / prior.spread
            else:
                row[j] = self.width[j] / prior.spread
                target = (prior.centre - self.lo[j]) / prior.spread
            rows.append(self.weight * row)
            rhs.append(self.weight * target)
        return np.array(rows).reshape(len(rows), n), np.array(rhs, dtype=float)

    def penalty(self, u: np.ndarray) -> float:
        return float(
            sum(p.penalty(self.lo[j] + u[j] * self.width[j]) for j, p in enumerate(self.priors) if p is not None)
        )
