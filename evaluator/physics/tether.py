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
_BISECTIONS = 20  # the cap to 2e-6 of itself: hi ends within 2x the cap after the doublings
_DOUBLINGS = 60


def envelope_steps(program: Program, constants: dict[str, float], env: Envelope) -> np.ndarray:
    """The program's step time (us) at every envelope point, at `constants` (NaN: not finite)."""
    from .floor import step_ratios

    return step_ratios(program, [constants[k] for k in program.constants], env)[0] * env.floor_us


def _quantile(s: np.ndarray) -> np.ndarray:
    """The TETHER_SHARE quantile over the last axis, numpy's linear one (by partition: faster than
    np.quantile on many rows; inf where the upper of the two ranks it interpolates is inf)."""
    n = s.shape[-1]
    at = TETHER_SHARE * (n - 1)
    i = min(int(at), max(n - 2, 0))
    j = min(i + 1, n - 1)
    ranked = np.partition(s, [i, j], axis=-1)
    low, high = ranked[..., i], ranked[..., j]
    with np.errstate(invalid="ignore"):
        return np.where(high == low, low, low + (at - i) * (high - low))


def _strays(steps: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|log(steps / reference)| at the TETHER_SHARE quantile over the last axis (inf: a step time
    that is not finite)."""
    with np.errstate(all="ignore"):
        s = np.abs(np.log(steps / reference))
    bad = ~np.isfinite(s).all(axis=-1)
    return np.where(bad, np.inf, _quantile(np.where(np.isfinite(s), s, 0.0)))


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
    # a term that adds time on too few points never moves the quantile past the limit: with k
    # unbounded, its points stray without end and the others as the parent does
    with np.errstate(all="ignore"):
        own = np.abs(np.log(steps / reference))
    endless = _quantile(np.where(g > 0, np.inf, own[None, :]))
    unbounded = finite & ~(endless > limit)
    caps[unbounded] = np.inf
    todo = np.flatnonzero(finite & ~unbounded)
    if not len(todo):
        return caps
    g = g[todo]
    import numexpr as ne  # here: the deployment rules import this module, and the CLI stays light

    # every step and reference time is finite and positive here (the parent's stray is finite) and
    # every g finite and >= 0: _strays without its guards, in one pass over the (rows, n) array
    base, log_ref = steps[None, :], np.log(reference)[None, :]

    def over(k: np.ndarray, rows: np.ndarray) -> np.ndarray:
        env = {"base": base, "k": k[:, None], "g": g[rows], "log_ref": log_ref}
        return _quantile(ne.evaluate("abs(log(base + k * g) - log_ref)", local_dict=env)) > limit

    with np.errstate(all="ignore"):  # the k at which the term's largest share of a step is 1
        hi = 1.0 / np.nanmax(g / np.where(steps > 0, steps, np.nan)[None, :], axis=1)
    hi = np.where(np.isfinite(hi) & (hi > 0), hi, 1.0)
    rows = np.arange(len(todo))
    for _ in range(_DOUBLINGS):  # every row is bounded at some k (none is `unbounded`)
        below = rows[~over(hi[rows], rows)]
        if not len(below):
            break
        hi[below] *= 2
        rows = below
    lo = np.zeros_like(hi)
    everything = np.arange(len(todo))
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        out = over(mid, everything)
        hi, lo = np.where(out, mid, hi), np.where(out, lo, mid)
    caps[todo] = lo
    return caps
