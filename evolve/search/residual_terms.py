"""What the `residual_term` operator (emitters.ResidualEmitter) proposes: a child that is its parent
plus the term that best explains where the parent is wrong (evaluator/discovery).

For a parent at its fitted constants, its per-request residuals on its own schedule are screened
against the typed library of candidate terms (discovery/terms.py) in closed form; the child adds
the best term that passed the screening's held-out and chance checks and that this operator has
not proposed for this parent before (or, once single terms are spent, the best pair), its scale
constant starting at the screening's coefficient (a weak prior around it) and its knot, if any, a
constant bounded inside the data's range; a share or efficiency term may go inside one side of the
parent's roofline (`Term.within`, discovery/sites.py). Where no term passes at the parent's
constants, the screening runs again beside them refitted (`ResidualSource.refit`, --residual-refit
fallback, the default). Each coefficient is screened, and bounded in the child,
at most at the value that keeps the child's step times within the tether of its own seed's over the
floor's envelope (screening.tethered_to): the deployment rules refuse a child that strays further,
so a term that only helps where it strays is not proposed. The child then goes through the usual cascade: the
closed loop judges it, as every child. Residuals and screenings are kept per parent for the run
(`ResidualSource`), which the LLM emitter also reads for its prompt's residual summary.
"""

from __future__ import annotations

import ast
import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from stepml_evolve.archive.records import ProgramRecord, seed_ancestor
from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.discovery.explain import explain, residual_summary
from stepml_evolve.evaluator.discovery.residuals import RequestResiduals, ResidualsError, residuals_of
from stepml_evolve.evaluator.discovery.screening import Screened, Screening, screen_program, tethered_to
from stepml_evolve.evaluator.discovery.terms import QUEUE, knot_bounds, step_values
from stepml_evolve.evaluator.dsl import Program, parse_program
from stepml_evolve.evaluator.dsl.program import Prior, inlined, render_constants
from stepml_evolve.evaluator.dsl.pyparse import parse_python
from stepml_evolve.evaluator.physics.rules import DEFAULT_SPREAD, summed_times
from stepml_evolve.evaluator.scoring.pool import ReplayPool

from .structure import structure_hash

OPERATOR = "residual_term"
KNOT_SPREAD = math.log(2.0)  # a knot's prior: a factor of 2 a spread around the quantile screening found
CACHED = 64  # parents whose residuals and screening are kept


@dataclass
class ResidualSource:
    """Residuals and screenings of the run's parents, computed once each (replays on the run's pool)."""

    pool: ReplayPool
    experiments: list[Experiment]
    refit: str = "fallback"  # screened beside the parent's refitted constants: fallback, always or never
    residuals: dict[object, list[RequestResiduals] | str] = field(default_factory=dict)  # by a program's key
    screenings: dict[object, Screening] = field(default_factory=dict)

    def of(self, parent_id, program: Program, constants: dict[str, float]) -> list[RequestResiduals] | str:
        """The parent's residuals, or why there are none (one line)."""
        if parent_id not in self.residuals:
            if len(self.residuals) >= CACHED:
                self.residuals.pop(next(iter(self.residuals)))
            try:
                self.residuals[parent_id] = residuals_of(
                    program, constants, self.pool, self.experiments, origin=f"#{parent_id}"
                )
            except ResidualsError as e:
                self.residuals[parent_id] = str(e)
        return self.residuals[parent_id]

    def screening(
        self, parent_id, program: Program, constants: dict[str, float], seed: Program | None = None
    ) -> Screening | str:
        """The parent's screening, each coefficient tethered to `seed` (at its own constants; none:
        the parent's); beside its refitted constants as `refit` says."""
        found = self.of(parent_id, program, constants)
        if isinstance(found, str):
            return found
        if parent_id not in self.screenings:
            if len(self.screenings) >= CACHED:
                self.screenings.pop(next(iter(self.screenings)))
            tether = tethered_to(program, constants, seed)
            screening = screen_program(program, constants, found, tether, refit=self.refit == "always")
            if self.refit == "fallback" and not screening.passed:
                screening = screen_program(program, constants, found, tether, refit=True)
            self.screenings[parent_id] = screening
        return self.screenings[parent_id]

    def summary(self, parent_id, program: Program, constants: dict[str, float], top: int = 4) -> str:
        """Where the parent's error grows, a line per association (empty where there are no residuals)."""
        found = self.of(parent_id, program, constants)
        return "" if isinstance(found, str) else residual_summary(explain(found), top)


def _fresh(prefix: str, taken: set[str]) -> str:
    i = 1
    while f"{prefix}{i}" in taken:
        i += 1
    taken.add(f"{prefix}{i}")
    return f"{prefix}{i}"


def with_terms(
    parent: Program,
    constants: dict[str, float],
    screened: list[Screened],
    knot_values: dict[str, object],
    doc: str,
) -> str:
    """The parent's text at `constants` with the screened terms added to step_time's return, or to
    the side of its roofline they were screened in (`Term.within`; a
    queueing term to queueing_time's, which it makes if the parent has none), each
    with its scale constant (start: the screening's coefficient, min 0, a weak prior around it) and
    its knot (bounded inside the data's range)."""
    taken = set(parent.constants)
    values, bounds, priors = dict(constants), dict(parent.bounds), dict(parent.priors)
    added = []
    for s in screened:
        k = _fresh("k", taken)
        start = s.coefficient if s.coefficient > 0 else min(1.0, s.cap)
        values[k], bounds[k], priors[k] = start, (0.0, s.cap), Prior(start, DEFAULT_SPREAD, True)
        t = None
        if s.term.knot is not None:
            t = _fresh("t", taken)
            lo, hi = knot_bounds(s.term, knot_values[s.term.knot_of])
            values[t], bounds[t], priors[t] = (
                min(max(s.term.knot, lo), hi),
                (lo, hi),
                Prior(s.term.knot, KNOT_SPREAD, True),
            )
        added.append((s.term.site, s.term.within, parse_python(s.term.text(k, t), "eval").body))
    functions = []
    for name, fn in parent.functions.items():
        fn = copy.deepcopy(fn)
        ret = fn.body[-1]
        for site, within, term in added:
            if site == name and within is not None:
                within.placed(fn, term)
            elif site == name:
                ret.value = ast.BinOp(left=ret.value, op=ast.Add(), right=term)
        functions.append(ast.unparse(ast.fix_missing_locations(fn)))
    queued = [term for site, _, term in added if site == QUEUE]
    if queued and QUEUE not in parent.functions:  # no queueing time yet: the terms are all of it
        body = ast.unparse(functools.reduce(lambda a, b: ast.BinOp(left=a, op=ast.Add(), right=b), queued))
        functions.append(f"def {QUEUE}(r, c):\n    return {body}")
    return f'"""{doc}"""\n{render_constants(values, bounds, priors)}\n\n\n' + "\n\n\n".join(functions) + "\n"


def next_child(
    source: ResidualSource,
    parent_id,
    program: Program,
    constants: dict[str, float],
    tried: set[str],
    seed: Program | None = None,
) -> tuple[str, str] | str:
    """(the child's text, what it adds) for the best passing term of the parent's screening (then the
    best pair), tethered to `seed`, whose child's structure is not in `tried` (to which it is added);
    else "rule: why" (rule residuals: none could be computed; screening: no term passed, or all were
    proposed)."""
    found = source.screening(parent_id, program, constants, seed)
    if isinstance(found, str):
        return f"residuals: {found}"
    summed = summed_times(inlined(program.functions["step_time"]))
    values = step_values([r.components for r in source.residuals[parent_id]])

    def fits(s: Screened) -> bool:  # a term inside a side was screened only where the side lacks its times
        return s.term.within is not None or not (set(s.term.times) & summed)

    options = [[s] for s in found.passed if fits(s)]
    options += [
        [a, b] for a, b, _ in found.pairs if fits(a) and fits(b) and not (set(a.term.times) & set(b.term.times))
    ]
    for chosen in options:
        text = with_terms(program, constants, chosen, values, program.doc or f"{OPERATOR} child")
        key = structure_hash(parse_program(text))
        if key not in tried:
            tried.add(key)
            return text, "; ".join(said(s, found.refitted) for s in chosen)
    if not found.passed:
        beside = (
            " (beside the parent's refitted constants too)" if found.refitted and source.refit == "fallback" else ""
        )
        return (
            f"screening: no term passed the screening of {len(found.results)}{beside} (false passes by chance "
            f"{found.false_passes:.1%}; {found.capped} bounded by the tether)"
        )
    return f"screening: the {len(options)} screened terms were proposed for this parent before"


def seed_of(program: ProgramRecord, lookup: Callable[[int], ProgramRecord | None]) -> Program | None:
    """The seed `program` descends from by first parents (the oldest ancestor `lookup` finds when the
    chain leaves it), parsed, as the deployment rules' tether takes it; None: `program` is that seed."""
    root = seed_ancestor(program, lookup)
    return None if root is program else parse_program(root.source)


def said(s: Screened, refitted: bool = False) -> str:
    held = ", ".join(f"by {g} {v:+.1%}" for g, v in s.held_out.items())
    bound = f", k at most {s.cap:.4g} (tether)" if math.isfinite(s.cap) else ""
    return (
        f"{s.term.shown()} (screened{' beside refitted constants' if refitted else ''}: {s.gain:.1%} of the "
        f"residual, {s.chance:.1%} by chance, held out {held}{bound})"
    )
