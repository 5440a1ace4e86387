"""The tether: how far a program's step times stray from a reference's (its seed's, as generation 0
fitted it) over the floor's envelope, the steps users simulate, most of which no data reach.

The deployment rules `tethered` and `guarded` refuse a child whose factor exceeds TETHER_FACTOR
(evolve/deploy/rules.py); the `residual_term` operator bounds a proposed term's coefficient so that
the child it proposes stays inside it (`coefficient_caps`): a term fitted to the residuals that
would take the step times where no data judge them is either smaller or not proposed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the floor compiles programs: imported where a step time is computed, so the CLI stays light
    from stepml_evolve.evaluator.dsl import Program

    from .floor import Envelope

TETHER_FACTOR = 1.5  # a child's step times stay within this factor of its seed's ...
TETHER_SHARE = 0.95  # ... on this share of the envelope's steps
_BISECTIONS = 40
_DOUBLINGS = 60


def envelope_steps(program: Program, constants: dict[str, float], env: Envelope) -> np.ndarray:
    """The program's step time (us) at every envelope point, at `constants` (NaN: not finite)."""
    from .floor import step_ratios

    return step_ratios(program, [constants[k] for k in program.constants], env)[0] * env.floor_us


def _strays(steps: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|log(steps / reference)| at the TETHER_SHARE quantile, over the last axis (inf: not finite)."""
    with np.errstate(all="ignore"):
        s = np.abs(np.log(steps / reference))
    bad = ~np.isfinite(s).all(axis=-1)
    return np.where(bad, np.inf, np.quantile(np.where(np.isfinite(s), s, 0.0), TETHER_SHARE, axis=-1))


def stray(steps: np.ndarray, reference: np.ndarray) -> float:
    """The factor `steps` stray from `reference` on TETHER_SHARE of the points (1.0: the same; inf:
    a step time that is not finite)."""
    return float(np.exp(_strays(steps, reference)))


def coefficient_caps(
    columns: np.ndarray, steps: np.ndarray, reference: np.ndarray, factor: float = TETHER_FACTOR
) -> np.ndarray:
    """For each term g (a row of `columns`, (K, n) on the envelope), the largest k >= 0 such that
    `steps + k * g` strays at most `factor` from `reference` (bisection; the stray grows with k once
    the term's time dominates): 0 where `steps` already stray more or g is not finite, inf where g is
    0 everywhere."""
    columns = np.atleast_2d(np.asarray(columns, dtype=np.float64))
    limit = math.log(factor)
    caps = np.zeros(len(columns))
    finite = np.isfinite(columns).all(axis=1)
    g = np.where(np.isfinite(columns), columns, 0.0)
    if not _strays(steps, reference) <= limit:
        return caps
    zero = finite & (g == 0).all(axis=1)
    caps[zero] = np.inf
    todo = np.flatnonzero(finite & ~zero)
    if not len(todo):
        return caps
    g = g[todo]

    def over(k: np.ndarray) -> np.ndarray:
        return _strays(steps[None, :] + k[:, None] * g, reference[None, :]) > limit

    with np.errstate(all="ignore"):  # the k at which the term's largest share of a step is 1
        hi = 1.0 / np.nanmax(g / np.where(steps > 0, steps, np.nan)[None, :], axis=1)
    hi = np.where(np.isfinite(hi) & (hi > 0), hi, 1.0)
    bounded = over(hi)
    for _ in range(_DOUBLINGS):
        if bounded.all():
            break
        hi = np.where(bounded, hi, hi * 2)
        bounded = over(hi)
    lo = np.zeros_like(hi)
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        out = over(mid)
        hi, lo = np.where(out, mid, hi), np.where(out, lo, mid)
    caps[todo] = np.where(bounded, lo, np.inf)
    return caps
