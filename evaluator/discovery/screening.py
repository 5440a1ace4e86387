"""Screening candidate terms in closed form on a fitted program's frozen schedule.

Adding `k * g(step)` to step_time moves each measured request's E2E and TTFT by k times the sum
of g over its own steps (residuals.py). So on the per-request residuals (observed - predicted,
relative to the split's observed mean; each experiment's E2E rows and TTFT rows weigh one in all,
as the loss weighs experiments), the best k >= 0 of a candidate is one least-squares solve and its
gain the share of the residual sum of squares it removes: microseconds a term, not a fit.

Chance: with a thousand candidates some will fit noise. A term passes only if, for each grouping
of the experiments the data allow (by model, by workload: at least two groups), its coefficient
fitted without a group lowers that group's residual, summed over the groups (held-out gain > 0).
A grouping judges a term only where some group and the rest both see it (its column is not zero
on either side): a term only one model's experiments exercise (a collective latency where one model
runs at TP > 1) cannot be judged by model, so it needs a held-out gain by workload alone, and a term
no grouping can judge does not pass. Its gain on all rows must be at least MIN_GAIN, and MIN_GAIN
more than chance: the most it gains on the residuals shuffled among the requests of each experiment
(which keeps every experiment's bias, so a term one model alone sees soaks up that model's bias by
chance too, and breaks every association with the steps; SHUFFLES times) plus twice the spread of
those gains. The screening reports its own false-discovery rate: the share of the candidates the
same test passes with one shuffle taken for the residuals and the others for chance.

Pairs: the best passing terms are also tried two at a time (bounded least squares, scipy's
lsq_linear), and a pair is kept where it removes more than either of its terms alone by MIN_GAIN.

Refitted beside the parent's constants (`screen_program(..., refit=True)`; the search's residual_term
screens so where no term passes at them; refit.py): its own constants,
linearized on the frozen schedule, are fitted on all rows beside each term and taken out of the
term's column and of the residuals alike (`_projected`), so a term gains what it removes beyond
them, on all rows, held out (the term refitted without a group, the constants as fitted on all
rows, as the parent's were), on the shuffles and in pairs. The fit that found the parent's
constants soaked up part of any mechanism it lacks; the child's fit refits them. (Refitting the
constants in each held-out fit too extrapolated them to the left-out model: held-out gains of
several times the residual on the real data.)

A queueing term (terms.py, family request) delays its request before any step: it adds itself to
the request's E2E and TTFT (`term_sums`), moves no step time (so the tether does not bound it) and
is bounded instead by QUEUE_MAX_US at the data's median prompt.

Tethered: with a `tether` (`tethered_to`), each term's coefficient, on all rows, in every held-out
fit and on the shuffled residuals alike, is at most the largest that keeps the parent's step times
within TETHER_FACTOR of its seed's over the floor's envelope (physics/tether.py), and a pair is kept
only if its two terms at their coefficients stay within it together: the deployment rules refuse a
child that strays further, so the screening weighs a term by what it may gain there.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numexpr as ne
import numpy as np
from scipy.optimize import lsq_linear

from stepml_evolve.evaluator.dsl import Program
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX
from stepml_evolve.evaluator.physics.floor import envelope_for
from stepml_evolve.evaluator.physics.tether import TETHER_FACTOR, coefficient_caps, envelope_steps, stray

from .refit import refit_columns
from .residuals import E2E, TTFT, RequestResiduals
from .sites import Site, sites_of
from .terms import QUEUE, REQUEST_FIELDS, STEP, Term, library, placed, step_values

SiteWeights = dict[Site, np.ndarray]  # a site's weight (the step time's derivative there) per step

MIN_GAIN = 0.005  # a term must remove at least 0.5 % of the residual sum of squares
GROUPINGS = ("model", "workload")
CHUNK = 128  # candidate columns evaluated at once (memory: steps x CHUNK floats per experiment)
SHUFFLES = 8  # permutations of the residuals: chance for each term, and the false-discovery check
REFINE = 25  # knots tried around a hinge's or switch's best one
REFINED = 4  # beside refitted constants: the best passing hinges and switches (one per form) whose knot is refined
QUEUE_MAX_US = 15000.0  # a queueing term at the data's median prompt: at most the seeds' own queue_us bound


@dataclass
class Screened:
    """One candidate's result: its coefficient (us per unit of g) on all rows, the share of the
    residual sum of squares it removes there, and per grouping what it removes held out."""

    term: Term
    coefficient: float
    gain: float
    held_out: dict[str, float] = field(default_factory=dict)  # only the groupings that can judge the term
    passed: bool = False
    chance: float = 0.0  # the most it gains on residuals shuffled among each experiment's requests, + 2 spreads
    cap: float = np.inf  # the largest coefficient the tether allows (`tethered_to`)


@dataclass
class Screening:
    """A screening's results, best first; its false-discovery check; the pairs it kept."""

    results: list[Screened]
    sse: float  # the residual sum of squares before any term
    skipped: int  # candidates whose column was not finite somewhere: never proposed
    false_passes: float  # mean share of candidates that pass on shuffled residuals
    pairs: list[tuple[Screened, Screened, float]] = field(default_factory=list)  # (a, b, gain together)
    capped: int = 0  # candidates whose coefficient the tether bounds below their best fit
    refitted: bool = False  # beside the parent's refitted constants

    @property
    def passed(self) -> list[Screened]:
        return [s for s in self.results if s.passed]


class _Rows:
    """The residual rows of every experiment, their weights and groups, and the columns of the
    parent's own constants refitted beside each term (refit.py; none: P = 0)."""

    def __init__(
        self,
        residuals: list[RequestResiduals],
        refit: list[np.ndarray] | None = None,
        at_sites: list[SiteWeights] | None = None,
    ):
        self.residuals = residuals
        self.at_sites = at_sites or [{} for _ in residuals]  # per experiment: each site's weight per step
        self.masks, self.y, self.w = [], [], []
        for r in residuals:
            measured = np.stack([r.finished, np.ones(r.n, bool)])
            counts = measured.sum(axis=1)
            w = np.where(measured, 1.0 / np.maximum(counts, 1)[:, None], 0.0)
            self.masks.append(measured)
            self.y.append(r.residual)
            self.w.append(w)
        self.groups = {g: [getattr(r, g) for r in residuals] for g in GROUPINGS}
        self.j = refit if refit is not None else [np.zeros((2, r.n, 0)) for r in residuals]
        self.jj = np.array([np.einsum("ij,ijp,ijq->pq", w, j, j) for w, j in zip(self.w, self.j)])  # (E, P, P)

    def jy(self, ys: list[np.ndarray]) -> np.ndarray:
        """(E, P) sum w J y per experiment, for the residual set `ys`."""
        return np.array([np.einsum("ij,ijp,ij->p", w, j, y) for w, j, y in zip(self.w, self.j, ys)])

    def shuffled(self, rng: np.random.Generator) -> list[np.ndarray]:
        out = []
        for y, m in zip(self.y, self.masks):
            z = np.zeros_like(y)
            for row in (E2E, TTFT):
                idx = np.flatnonzero(m[row])
                z[row, idx] = y[row, rng.permutation(idx)]
            out.append(z)
        return out


def _evaluated(terms: list[Term], env: dict[str, np.ndarray], n: int) -> np.ndarray:
    """(n, K) each term's column (numexpr over `env`), broadcast to n rows."""
    out = np.empty((n, len(terms)))
    with np.errstate(all="ignore"):
        for j, t in enumerate(terms):
            out[:, j] = np.broadcast_to(ne.evaluate(t.column, local_dict=env), (n,))
    return out


def columns_of(components: np.ndarray, terms: list[Term], at_sites: SiteWeights | None = None) -> np.ndarray:
    """(S, K) what the terms at k = 1 add to every step of `components` ((N_COMPONENTS, S)): g, times
    its site's weight for a term inside a side of the roofline (`at_sites`, sites.py)."""
    env = {f"f_{n}": components[i] for n, i in COMPONENT_INDEX.items()}
    return _weighted(_evaluated(terms, env, components.shape[1]), terms, at_sites)


def _weighted(columns: np.ndarray, terms: list[Term], at_sites: SiteWeights | None) -> np.ndarray:
    for j, t in enumerate(terms):
        if t.within is not None:
            columns[:, j] *= at_sites[t.within]
    return columns


def _at(terms: list[Term], site: str) -> list[int]:
    """The positions of the terms added to `site` (terms.STEP, terms.QUEUE)."""
    return [j for j, t in enumerate(terms) if t.site == site]


def request_columns(r: RequestResiduals, terms: list[Term]) -> np.ndarray:
    """(n, K) the queueing terms' g for each of r's requests."""
    return _evaluated(terms, {f"r_{x}": getattr(r, x) for x in REQUEST_FIELDS}, r.n)


def term_sums(r: RequestResiduals, terms: list[Term], at_sites: SiteWeights | None = None) -> np.ndarray:
    """(2, n, K) what each term at k = 1 adds to each of r's requests' E2E and TTFT (relative to the
    split's observed mean): a step's term summed over the request's steps, a queueing term itself."""
    steps = _at(terms, STEP)
    if len(steps) == len(terms):
        return r.sums(columns_of(r.components, terms, at_sites))
    out = np.empty((2, r.n, len(terms)))
    if steps:
        out[:, :, steps] = r.sums(columns_of(r.components, [terms[j] for j in steps], at_sites))
    queued = _at(terms, QUEUE)
    out[:, :, queued] = r.delays(request_columns(r, [terms[j] for j in queued]))
    return out


def _queue_caps(residuals: list[RequestResiduals], terms: list[Term]) -> np.ndarray:
    """Each queueing term's largest coefficient: QUEUE_MAX_US at its median value over the requests
    (no bound on a step's term)."""
    caps = np.full(len(terms), np.inf)
    queued = _at(terms, QUEUE)
    if queued and residuals:
        median = np.median(np.concatenate([request_columns(r, [terms[j] for j in queued]) for r in residuals]), axis=0)
        caps[queued] = np.where(median > 0, QUEUE_MAX_US / np.where(median > 0, median, 1.0), 0.0)
    return caps


_ENVELOPE_COLUMNS: dict[str, np.ndarray] = {}  # a term's column over the envelope last used ...
_ENVELOPE: list[np.ndarray] = []  # ... which is every parent's of a run (the floor caches it)
_ENVELOPE_COLUMNS_KEPT = 4000  # about 100 MB over the catalog's envelope
_ENVELOPE_LOCK = threading.Lock()


def envelope_columns(components: np.ndarray, terms: list[Term]) -> np.ndarray:
    """columns_of(components, terms), each term's column computed once per envelope: every screening
    of a run caps the same library's terms over the same envelope."""
    with _ENVELOPE_LOCK:  # OpenEvolve's engine screens on its HTTP server's threads
        if not (_ENVELOPE and _ENVELOPE[0] is components) or len(_ENVELOPE_COLUMNS) > _ENVELOPE_COLUMNS_KEPT:
            _ENVELOPE[:] = [components]
            _ENVELOPE_COLUMNS.clear()
        missing = list({t.column: t for t in terms if t.column not in _ENVELOPE_COLUMNS}.values())
        if missing:
            raw = columns_of(
                components, [dataclasses.replace(t, within=None) for t in missing]
            )  # g: weighted by Tether
            _ENVELOPE_COLUMNS.update(zip((t.column for t in missing), raw.T))
        out = np.empty((components.shape[1], len(terms)))
        for j, t in enumerate(terms):
            out[:, j] = _ENVELOPE_COLUMNS[t.column]
    return out


@dataclass
class Tether:
    """A parent's step times and its seed's over the floor's envelope (`tethered_to`): how large a
    term added to the parent may be, alone or with others, for the child to stay within the tether."""

    components: np.ndarray  # the envelope's (N_COMPONENTS, n)
    steps: np.ndarray  # the parent's step times there
    reference: np.ndarray  # its seed's
    at_sites: SiteWeights = field(default_factory=dict)  # the parent's sites' weights there

    def columns(self, terms: list[Term]) -> np.ndarray:
        return _weighted(envelope_columns(self.components, terms), terms, self.at_sites)

    def caps(self, terms: list[Term]) -> np.ndarray:
        """The largest coefficient of each term alone (a queueing term moves no step: no bound)."""
        caps = np.full(len(terms), np.inf)
        steps = _at(terms, STEP)
        if steps:
            columns = self.columns([terms[j] for j in steps])
            caps[steps] = coefficient_caps(columns.T, self.steps, self.reference)
        return caps

    def holds(self, terms: list[Term], coefficients) -> bool:
        """Whether the parent plus these terms at these coefficients stays within the tether."""
        steps = _at(terms, STEP)
        coefficients = np.asarray(coefficients, dtype=np.float64)[steps]
        added = self.columns([terms[j] for j in steps]) @ coefficients
        return stray(self.steps + added, self.reference) <= TETHER_FACTOR * (1 + 1e-9)


def tethered_to(
    program: Program, constants: dict[str, float], seed: Program | None = None, seed_constants: dict | None = None
) -> Tether:
    """The tether of terms added to `program` at `constants`: its step times within the factor of
    `seed`'s (at `seed_constants`; none: the program's own)."""
    env = envelope_for()
    steps = envelope_steps(program, constants, env)
    reference = steps if seed is None else envelope_steps(seed, seed_constants or seed.constants, env)
    return Tether(env.components, steps, reference, site_weights(program, constants, env.components))


def _moments(
    rows: _Rows, terms: list[Term], ys: list[list[np.ndarray]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per experiment e and candidate k: a[v, e, k] = sum w X y (for each residual set v of `ys`),
    b[e, k] = sum w X^2, jx[e, :, k] = sum w J X (J the refit columns); and which candidates are
    finite everywhere."""
    n_e, n_k = len(rows.residuals), len(terms)
    a, b = np.zeros((len(ys), n_e, n_k)), np.zeros((n_e, n_k))
    jx = np.zeros((n_e, rows.jj.shape[1], n_k))
    finite = np.ones(n_k, bool)
    for e, r in enumerate(rows.residuals):
        x = term_sums(r, terms, rows.at_sites[e])  # (2, n, K)
        ok = np.isfinite(x).all(axis=(0, 1))
        finite &= ok
        x = np.where(np.isfinite(x), x, 0.0)
        w = rows.w[e][:, :, None]
        b[e] = (w * x * x).sum(axis=(0, 1))
        for v, y in enumerate(ys):
            a[v, e] = (w * x * y[e][:, :, None]).sum(axis=(0, 1))
        wj = (w * rows.j[e]).reshape(2 * r.n, jx.shape[1])
        jx[e] = wj.T @ x.reshape(2 * r.n, n_k)
    return a, b, jx, finite


def _solve(jj: np.ndarray) -> np.ndarray:
    """The inverse of the refit columns' Gram matrix, each column scaled to unit norm first (their
    sizes differ by many orders) with a ridge of 1e-9; a column the rows never move stays at 0."""
    d = np.sqrt(np.diag(jj))
    scale = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    unit = jj * scale[:, None] * scale[None, :]
    return scale[:, None] * np.linalg.inv(unit + 1e-9 * np.eye(len(d))) * scale[None, :]


def _projected(
    a: np.ndarray, b: np.ndarray, jx: np.ndarray, jj: np.ndarray, jy: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per experiment, a (E, K) and b (E, K) of the terms and the residuals once the refit columns,
    fitted on all rows, are taken out of both (Frisch-Waugh: a term's least-squares coefficient
    and gain on all rows are then those of the term fitted beside the columns). From their
    moments jx (E, P, K), jj (E, P, P), jy (E, P); with no column, a and b themselves. The columns
    are fitted on all rows, as the parent's constants were; a held-out fit refits the term alone."""
    inv = _solve(jj.sum(axis=0))
    theta, shift = inv @ jy.sum(axis=0), inv @ jx.sum(axis=0)  # (P,), (P, K)
    a = (
        a
        - np.einsum("pk,ep->ek", shift, jy)
        - np.einsum("p,epk->ek", theta, jx)
        + np.einsum("pk,epq,q->ek", shift, jj, theta)
    )
    b = b - 2 * np.einsum("pk,epk->ek", shift, jx) + np.einsum("pk,epq,qk->ek", shift, jj, shift)
    return a, b


def _gains(
    a: np.ndarray, b: np.ndarray, sse: float, groups: dict[str, list], cap: np.ndarray, seen: np.ndarray
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Coefficients (at most `cap`), gains (share of sse) on all rows, and per grouping the held-out
    gain, from the per-experiment moments a (E, K), b (E, K) (`_projected`); NaN where the grouping
    cannot judge a term: in no fold do both the held-out group and the rest see it (`seen`: its own
    sum of squares per experiment, (E, K))."""
    at, bt = a.sum(axis=0), b.sum(axis=0)
    beta = _fitted(at, bt, cap)
    gain = (2 * beta * at - beta**2 * bt) / sse
    held = {}
    for g, labels in groups.items():
        labels = np.array(labels)
        kinds = np.unique(labels)
        if len(kinds) < 2:
            continue
        total = np.zeros(a.shape[1])
        judged = np.zeros(a.shape[1], bool)
        for kind in kinds:
            inside = labels == kind
            ai, bi = a[inside].sum(axis=0), b[inside].sum(axis=0)
            bet = _fitted(at - ai, bt - bi, cap)
            total += 2 * bet * ai - bet**2 * bi
            si = seen[inside].sum(axis=0)
            judged |= (si > 0) & (seen.sum(axis=0) - si > 0)
        held[g] = np.where(judged, total / sse, np.nan)
    return beta, gain, held


def _fits(rows: _Rows, a: np.ndarray, b: np.ndarray, jx: np.ndarray, ys: list, cap: np.ndarray) -> list[tuple]:
    """`_gains` of the terms on each residual set of `ys` (a[v]), beside the refit columns."""
    out = []
    for v, y in enumerate(ys):
        projected = _projected(a[v], b, jx, rows.jj, rows.jy(y))
        out.append(_gains(*projected, _sse(rows.w, y), rows.groups, cap, b))
    return out


def _judged(held: dict[str, np.ndarray], k: int) -> dict[str, float]:
    """Term k's held-out gain in each grouping that can judge it."""
    return {g: float(h[k]) for g, h in held.items() if not np.isnan(h[k])}


def _fitted(a: np.ndarray, b: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """The least-squares coefficient in [0, cap] of each term (its gain is concave in it)."""
    return np.minimum(np.where(b > 0, np.maximum(a, 0.0) / np.where(b > 0, b, 1.0), 0.0), cap)


def _chance(null_gains: list[np.ndarray]) -> np.ndarray:
    """What each term may gain by chance: the most it gains on the shuffled residuals, plus twice
    their spread (a term's gain on residuals with structure must clear it by MIN_GAIN)."""
    g = np.array(null_gains)
    return g.max(axis=0) + 2 * g.std(axis=0)


def _sse(weights: list[np.ndarray], ys: list[np.ndarray]) -> float:
    return float(sum((w * y * y).sum() for w, y in zip(weights, ys)))


def _passes(gain: np.ndarray, held: dict[str, np.ndarray], finite: np.ndarray, chance: np.ndarray) -> np.ndarray:
    """Finite everywhere, a gain of MIN_GAIN at least and MIN_GAIN over what it gains by chance,
    and a positive held-out gain in every grouping that can judge it, of which there is one at least."""
    ok = finite & (gain >= MIN_GAIN) & (gain - chance >= MIN_GAIN)
    judged = np.zeros_like(ok)
    for h in held.values():
        ok &= np.isnan(h) | (h > 0)
        judged |= ~np.isnan(h)
    return ok & judged


def screen(
    residuals: list[RequestResiduals],
    terms: list[Term],
    seed: int = 0,
    pairs_of: int = 12,
    refine: bool = True,
    tether: Tether | None = None,
    refit: list[np.ndarray] | None = None,
    at_sites: list[SiteWeights] | None = None,
) -> Screening:
    """Every term's gain on the residuals, best first, with its held-out gains and whether it passed;
    the passing hinges and switches (with `refit`, the best REFINED) have their knot refined (REFINE
    knots between the neighbouring quantiles); the best `pairs_of` are tried in pairs. `tether`: each term's coefficient
    is at most its cap, and a pair is kept only if the two together stay within it. `refit`: the
    parent's own constants' columns (refit.refit_columns), fitted beside every term: a term gains
    what it adds once they are refitted with it."""

    def caps(ts: list[Term]) -> np.ndarray:
        bound = _queue_caps(residuals, ts)
        return bound if tether is None else np.minimum(bound, tether.caps(ts))

    rows = _Rows(residuals, refit, at_sites)
    sse = _sse(rows.w, rows.y)
    if not sse > 0 or not terms:
        return Screening([], sse, 0, 0.0)
    rng = np.random.default_rng(seed)
    ys = [rows.y] + [rows.shuffled(rng) for _ in range(SHUFFLES)]
    parts = [_moments(rows, terms[i : i + CHUNK], ys) for i in range(0, len(terms), CHUNK)]
    a, b, jx, finite = (np.concatenate(m, axis=axis) for m, axis in zip(zip(*parts), (2, 1, 2, 0)))
    cap = caps(terms)
    fits = _fits(rows, a, b, jx, ys, cap)
    beta, gain, held = fits[0]
    chance = _chance([g for _, g, _ in fits[1:]])  # what each term gains on residuals with no structure
    passed = _passes(gain, held, finite, chance)
    # the same test with the first shuffle as the residuals and the others as chance
    false = _passes(fits[1][1], fits[1][2], finite, _chance([g for _, g, _ in fits[2:]])).mean()
    results = [
        Screened(
            t,
            float(beta[k]),
            float(gain[k]),
            _judged(held, k),
            bool(passed[k]),
            float(chance[k]),
            float(cap[k]),
        )
        for k, t in enumerate(terms)
        if finite[k]
    ]
    results.sort(key=lambda s: (not s.passed, -s.gain))
    if refine:
        results = _refined(rows, results, sse, caps, ys, len(results) if refit is None else REFINED)
    unbounded = _fitted(*(m.sum(axis=0) for m in _projected(a[0], b, jx, rows.jj, rows.jy(rows.y))), np.inf)
    capped = int((finite & (unbounded > cap)).sum())
    screening = Screening(results, sse, int((~finite).sum()), float(false), capped=capped, refitted=refit is not None)
    screening.pairs = _pairs(rows, screening.passed[:pairs_of], sse, tether)
    return screening


def screen_program(
    program: Program,
    constants: dict[str, float],
    residuals: list[RequestResiduals],
    tether: Tether | None = None,
    refit: bool = False,
) -> Screening:
    """The library of the residuals' own steps screened on `program`'s residuals at `constants`; with
    `refit`, its own constants refitted beside every term (refit.py); the share and efficiency terms
    also inside each side of its rooflines (sites.py)."""
    sites = sites_of(program)
    terms = library(step_values([r.components for r in residuals]))
    terms += placed(terms, sites)
    columns = refit_columns(program, constants, residuals) if refit else None
    weights = [site_weights(program, constants, r.components, sites) for r in residuals]
    return screen(residuals, terms, tether=tether, refit=columns, at_sites=weights)


def site_weights(
    program: Program, constants: dict[str, float], components: np.ndarray, sites: list[Site] | None = None
) -> SiteWeights:
    """Each of the program's sites' weight (sites.py) at every step of `components`."""
    return {s: s.weights(program, constants, components) for s in (sites_of(program) if sites is None else sites)}


def _refined(
    rows: _Rows,
    results: list[Screened],
    sse: float,
    caps: Callable[[list[Term]], np.ndarray],
    ys: list[list[np.ndarray]],
    limit: int,
) -> list[Screened]:
    """The best `limit` passing hinges and switches (one per form), each at the best of REFINE knots
    spread between the knots next to its own (over the values the count takes): a planted knot
    between two quantiles is found. A refined knot must clear the chance of the best of the REFINE
    on the shuffled residuals `ys[1:]`. (Only the best are refined: the operator proposes the best
    terms and pairs of them, and beside the refitted constants dozens pass on the real data.)"""
    out = []
    seen: set[tuple[str, str]] = set()
    for s in results:
        key = (s.term.body, s.term.knot_of or "")
        if not s.passed or s.term.knot is None or key in seen or len(seen) >= limit:
            out.append(s)
            continue
        seen.add(key)
        siblings = sorted({r.term.knot for r in results if (r.term.body, r.term.knot_of) == key})
        i = siblings.index(s.term.knot)
        lo = siblings[i - 1] if i > 0 else s.term.knot / 2
        hi = siblings[i + 1] if i + 1 < len(siblings) else s.term.knot * 2
        candidates = [s.term.at(float(round(q))) for q in np.linspace(lo, hi, REFINE)]
        a, b, jx, finite = _moments(rows, candidates, ys)
        cap = caps(candidates)
        fits = _fits(rows, a, b, jx, ys, cap)
        beta, gain, held = fits[0]
        # the knot is the best of REFINE: so is its chance, the best of them on each shuffle
        chance = max(s.chance, float(_chance([g.max(keepdims=True) for _, g, _ in fits[1:]])[0]))
        ok = _passes(gain, held, finite, np.full(len(candidates), chance))
        k = int(np.argmax(np.where(ok, gain, -np.inf))) if ok.any() else -1
        if k >= 0 and gain[k] > s.gain:
            out.append(
                Screened(candidates[k], float(beta[k]), float(gain[k]), _judged(held, k), True, chance, float(cap[k]))
            )
        else:
            out.append(s)
    out.sort(key=lambda s: (not s.passed, -s.gain))
    return out


def _pairs(
    rows: _Rows, best: list[Screened], sse: float, tether: Tether | None = None
) -> list[tuple[Screened, Screened, float]]:
    """Pairs of the best passing terms fitted together (least squares, each coefficient in [0, its
    cap], the refit columns free beside them) whose gain beats each term alone by MIN_GAIN and that
    stay within the tether together, best first."""
    if len(best) < 2:
        return []
    terms = [s.term for s in best]
    xs, ys = [], []
    for e, r in enumerate(rows.residuals):
        x = np.concatenate([term_sums(r, terms, rows.at_sites[e]), rows.j[e]], axis=2)
        sw = np.sqrt(rows.w[e])
        xs.append((x * sw[:, :, None]).reshape(-1, x.shape[2]))
        ys.append((rows.y[e] * sw).reshape(-1))
    x, y = np.concatenate(xs), np.concatenate(ys)
    x = np.where(np.isfinite(x), x, 0.0)
    j_cols, x = x[:, len(terms) :], x[:, : len(terms)]
    # the refit columns, free, taken out of the terms and the residuals (Frisch-Waugh, as `_projected`)
    inv = _solve(j_cols.T @ j_cols)
    y = y - j_cols @ (inv @ (j_cols.T @ y))
    x = x - j_cols @ (inv @ (j_cols.T @ x))
    alone = float(y @ y)  # the residual left by the refit columns alone
    out = []
    for i in range(len(best)):
        for j in range(i + 1, len(best)):
            fit = lsq_linear(x[:, [i, j]], y, bounds=(0.0, [best[i].cap, best[j].cap]))
            coef, gain = fit.x, (alone - 2 * fit.cost) / sse
            better = (coef > 0).all() and gain >= max(best[i].gain, best[j].gain) + MIN_GAIN
            if better and (tether is None or tether.holds([best[i].term, best[j].term], coef)):
                out.append((best[i], best[j], float(gain)))
    out.sort(key=lambda p: -p[2])
    return out
