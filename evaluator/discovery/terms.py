"""The typed library of candidate terms a screening tries: each `k * g(step)` with k >= 0 a new
constant, g built from the components so that the term is a valid time under --physics check by
construction, whatever program it is added to:

  overhead    per step, per layer, per request (prefill, decode), per token, per context token:
              `k * X`, X a count (or 1)
  efficiency  a time component outside the program's roofline: `k * T` (work the roofline's max
              hides that the step does not overlap), or a group of them
  share       a time component's share per count: `k * T / n` (a fixed pad of tokens a GEMM tile
              rounds up to: `k * (f.gemm_pf + f.gemm_dc) / f.tokens`; per request, per chunk)
  log         `k * log(1 + X)` of a count or of KV blocks (`log(1 + f.ctx_sum / 16)`), and per request
              `k * f.n_req * log(1 + f.ctx_sum / f.n_req)` (a tree or a lookup over blocks or requests)
  hinge       `k * max(0, X - t)` past a knot t taken from the data's quantiles, also per layer
  switch      `(k * Y if X > t else 0)`: a code path taken only above a size (Y a count, 1, or a
              time component: a kernel that is slower there)
  collective  `k * X * log(f.tp)` and `k * X * max(0, f.tp - 1)`, X 1 or f.layers: a latency per hop of a
              tensor-parallel collective (a tree of log2(tp) hops, a ring of tp - 1), per layer's
              all-reduces or per step (the scheduler's inputs broadcast to the workers), 0 at tp 1;
              f.allreduce is only its bandwidth part, which NCCL's per-call latency dwarfs at the
              few tokens of a decode step
  request     `k * r.input_tokens`, added to queueing_time, not to step_time: work on a request's
              prompt before the engine schedules it (the API server tokenizes it and hashes its
              blocks for the prefix cache), which delays its first token and its last by the same
              time whatever the steps; the only causal request input that varies (output_tokens is
              not known at arrival, r.last_step_us is the seeds' own lag)

The efficiency and share terms are also tried inside each side of the program's roofline (`placed`,
sites.py): the work of a kernel, such as a tile's padding, that the weights' streaming hides where
the memory side binds.

No term subtracts time (k >= 0 and g >= 0), none multiplies a time by a count, a knot is a constant
bounded inside the data's range (so a condition always switches inside the envelope, which covers
the data), and a term whose time component the program already sums at its top level is left out
by the screening (`rules.counted_twice`). `column` is g as numexpr over the step's components
(f_<name>), with the knot as a literal: what screening evaluates.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX, TIME_COMPONENTS

from .sites import Site

COUNTS = ("n_req", "n_pf", "n_dc", "tok_pf", "tokens", "ctx_sum", "ctx_max")  # a step's counts that vary
PER = ("1", "layers", "n_req", "n_pf", "n_dc", "tok_pf", "tokens", "ctx_sum", "ctx_max", "experts")
TIMES = tuple(sorted(TIME_COMPONENTS))
TIME_GROUPS = (
    ("gemm_pf", "gemm_dc"),
    ("attn_pf", "attn_dc"),
    ("gemm_pf", "attn_pf"),
    ("gemm_dc", "attn_dc"),
    ("kv_read", "kv_write"),
)
SHARES = (
    (("gemm_pf", "gemm_dc"), "tokens"),
    (("gemm_pf",), "tok_pf"),
    (("gemm_dc",), "n_dc"),
    (("attn_pf",), "n_pf"),
    (("weights",), "n_req"),
)
LOGS = ("n_req", "n_pf", "n_dc", "tok_pf", "tokens", "ctx_max", "ctx_sum")
BLOCKED, BLOCK = ("ctx_sum", "ctx_max", "tokens"), 16  # counts of tokens also taken in KV blocks (vLLM's default size)
HINGED = ("ctx_max", "ctx_sum", "tok_pf", "tokens", "n_req", "n_dc")
SWITCHED_BY = ("ctx_max", "tok_pf", "n_dc", "n_req", "tokens", "ctx_sum")
SWITCHED = ("1", "layers", "n_req", *TIMES)
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
STEP, QUEUE = "step_time", "queueing_time"  # where a term is added
REQUEST_FIELDS = ("input_tokens",)  # a request's causal inputs a queueing term may scale
HOPS = (
    ("log(f.tp)", "log(f_tp)"),
    ("max(0, f.tp - 1)", "where(f_tp > 1.0, f_tp - 1.0, 0.0)"),
)  # a tree's hops, a ring's


@dataclass(frozen=True)
class Term:
    """One candidate: `family`, the DSL text of g with {k} for its scale constant (k * g) and {t}
    for its knot (if any), the knot's value and the component it bounds."""

    family: str
    body: str  # DSL: the term, with {k} and {t}
    column: str  # numexpr over f_<component> (a step's term) or r_<field> (a request's): g alone, the knot a literal
    knot: float | None = None
    knot_of: str | None = None
    times: tuple[str, ...] = ()  # the time components it reads (summed as themselves: `rules.counted_twice`)
    site: str = STEP  # the function it is added to: step_time (STEP) or queueing_time (QUEUE)
    within: Site | None = None  # inside one side of step_time's roofline (sites.py); None: added to its result

    def text(self, k: str, t: str | None = None) -> str:
        """The term in the DSL, its constants named k (and t)."""
        return self.body.format(k=f"c.{k}", t=f"c.{t}" if t else "")

    def shown(self) -> str:
        """The term with its knot written out (for tables and the archive's detail)."""
        text = self.body.format(k="k", t=_figure(self.knot) if self.knot is not None else "")
        return text if self.within is None else f"{text} inside max(.., {self.within.shown}, ..)"

    def at(self, knot: float) -> Term:
        """The same term at another knot."""
        column = self.column.replace(_literal(self.knot), _literal(knot))
        return dataclasses.replace(self, column=column, knot=knot)


def _figure(x: float) -> str:
    return f"{x:.4g}"


def _literal(x: float | None) -> str:
    return repr(float(x))


def _f(name: str) -> str:
    return "1" if name == "1" else f"f.{name}"


def _col(name: str) -> str:
    return "1.0" if name == "1" else f"f_{name}"


def _times_of(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(n for n in names if n in TIME_COMPONENTS)


def _scaled(body: str) -> str:
    return "{k}" if body == "1" else "{k} * " + body


def knots(values: np.ndarray, quantiles: Iterable[float] = QUANTILES) -> list[float]:
    """Distinct knots at the quantiles of a count's positive values over the data's steps, each
    strictly inside their range (so a condition on it switches on the data)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if len(np.unique(v)) < 2:
        return []
    lo, hi = float(v.min()), float(v.max())
    out = []
    for q in np.quantile(v, list(quantiles)):
        q = float(round(q))
        if lo < q < hi and q not in out:
            out.append(q)
    return out


def library(step_values: dict[str, np.ndarray] | None = None, quantiles: Iterable[float] = QUANTILES) -> list[Term]:
    """Every candidate term, the knots of hinges and switches at the quantiles of the counts'
    values over the data's steps (`step_values`: component name -> values; none: no knotted term)."""
    terms: list[Term] = []
    for x in PER:
        terms.append(Term("overhead", _scaled(_f(x)), _col(x)))
    for t in TIMES:
        terms.append(Term("efficiency", "{k} * " + _f(t), _col(t), times=(t,)))
    for group in TIME_GROUPS:
        terms.append(
            Term(
                "efficiency",
                "{k} * (" + " + ".join(map(_f, group)) + ")",
                "(" + " + ".join(map(_col, group)) + ")",
                times=group,
            )
        )
    for group, per in SHARES:
        body = " + ".join(map(_f, group))
        col = " + ".join(map(_col, group))
        terms.append(
            Term(
                "share",
                "{k} * (" + body + ") / " + _f(per),
                f"where({_col(per)} > 0, ({col}) / {_col(per)}, 0.0)",
                times=(),  # a share per count is a time of its own (not the component summed again)
            )
        )
    for x in LOGS:
        terms.append(Term("log", "{k} * log(1 + " + _f(x) + ")", f"log(1.0 + {_col(x)})"))
    for x in BLOCKED:  # of KV blocks (of BLOCK tokens): a lookup in a block table or a tree of them
        terms.append(Term("log", "{k} * log(1 + " + _f(x) + f" / {BLOCK})", f"log(1.0 + {_col(x)} / {float(BLOCK)!r})"))
    terms.append(
        Term(
            "log",
            "{k} * f.n_req * log(1 + f.ctx_sum / f.n_req)",
            "f_n_req * log(1.0 + where(f_n_req > 0, f_ctx_sum / f_n_req, 0.0))",
        )
    )
    terms.append(Term("log", "{k} * f.n_dc * log(1 + f.ctx_max)", "f_n_dc * log(1.0 + f_ctx_max)"))
    for per in ("1", "layers"):
        for body, col in HOPS:
            scaled = body if per == "1" else f"{_f(per)} * {body}"
            terms.append(Term("collective", "{k} * " + scaled, col if per == "1" else f"{_col(per)} * {col}"))
    for x in HINGED if step_values else ():
        for q in knots(step_values[x], quantiles):
            hinge_body, hinge_col = (
                f"max(0, {_f(x)} - {{t}})",
                f"where({_col(x)} > {_literal(q)}, {_col(x)} - {_literal(q)}, 0.0)",
            )
            terms.append(Term("hinge", "{k} * " + hinge_body, hinge_col, q, x))
            terms.append(Term("hinge", "{k} * f.layers * " + hinge_body, f"f_layers * {hinge_col}", q, x))
    for x in SWITCHED_BY if step_values else ():
        for q in knots(step_values[x], quantiles):
            for y in SWITCHED:
                body = "({k}" + ("" if y == "1" else f" * {_f(y)}") + f" if {_f(x)} > {{t}} else 0)"
                terms.append(
                    Term(
                        "switch",
                        body,
                        f"where({_col(x)} > {_literal(q)}, {_col(y)}, 0.0)",
                        q,
                        x,
                        times=(),  # inside a branch: a time of its own
                    )
                )
    for x in REQUEST_FIELDS:
        terms.append(Term("request", "{k} * r." + x, f"r_{x}", site=QUEUE))
    return terms


PLACED = ("share", "efficiency")  # the families that are also tried inside a roofline's side: work a kernel does
KINDS = (
    frozenset({"gemm_pf", "gemm_dc", "attn_pf", "attn_dc"}),
    frozenset({"weights", "kv_read", "kv_write"}),
    frozenset({"allreduce"}),
)  # compute, memory traffic, communication: a roofline's side overlaps work of its own kinds only


def placed(terms: list[Term], sites: list[Site]) -> list[Term]:
    """The terms of the PLACED families again inside each site (a side of a roofline, sites.py): those
    whose time components are all of a kind the side already holds (a tile's padding on the compute
    side, not the weights' streaming), none of which the side sums already (`rules.counted_twice`)."""
    out = []
    for s in sites:
        kinds = frozenset().union(*(k for k in KINDS if k & s.summed))
        for t in terms:
            reads = set(re.findall(r"f_(\w+)", t.column)) & TIME_COMPONENTS
            if t.family in PLACED and t.site == STEP and reads <= kinds and not (set(t.times) & s.summed):
                out.append(dataclasses.replace(t, within=s))
    return out


def step_values(components: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The counts the knots are taken from: each one's values over the steps of every experiment
    (`components`: each experiment's (N_COMPONENTS, S) array)."""
    return {x: np.concatenate([c[COMPONENT_INDEX[x]] for c in components]) for x in set(HINGED) | set(SWITCHED_BY)}


def knot_bounds(term: Term, values: np.ndarray) -> tuple[float, float]:
    """A knot constant's bounds: half to twice its value, kept strictly inside the range of the
    count's values over the data (so a fit cannot move a condition to where it never switches)."""
    v = np.unique(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v)]
    lo = float(v[:2].mean()) if len(v) >= 2 else 0.0
    hi = float(v[-2:].mean()) if len(v) >= 2 else math.inf
    return max(term.knot / 2, lo), min(term.knot * 2, hi)
