"""Thresholds: every condition of step_time switches inside the envelope of steps users simulate.

A branch that no envelope step takes is taken by no step of the data either (the envelope covers
the data: floor.envelope_for), so nothing fits it and nothing vouches for it, yet a user who
simulates past the threshold gets it. A threshold outside the envelope is therefore refused rather
than the envelope stretched to meet it: the envelope is what users simulate, and a program may not
widen it by naming a number. The check evaluates each condition of step_time on every envelope step
at the program's constants and, for a constant the condition reads (a threshold a fit moves), at
each of its bounds too: the condition must hold on some steps and fail on others at each. So a
threshold constant needs finite bounds inside the range of what it is compared with; a search's
child gets them (`threshold_bounds`) where it adds one. queueing_time's conditions read a request,
which the envelope does not hold: they are not checked.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator

import numpy as np

from stepml_evolve.evaluator.dsl import Program
from stepml_evolve.evaluator.dsl.numexpr_compile import compile_expression, evaluate_vector
from stepml_evolve.evaluator.dsl.program import inlined
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX
from stepml_evolve.evaluator.numbers import fmt
from stepml_evolve.evaluator.physics.floor import Envelope


def _is(node: ast.AST, base: str) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == base


def conditions(program: Program) -> list[ast.expr]:
    """The tests of step_time's if-elses, each once (locals inlined)."""
    seen: dict[str, ast.expr] = {}
    for node in ast.walk(inlined(program.functions["step_time"])):
        if isinstance(node, ast.IfExp):
            seen.setdefault(ast.dump(node.test), node.test)
    return list(seen.values())


def _holds(test: ast.expr, env: Envelope, constants: dict[str, float]) -> np.ndarray:
    inputs = _inputs(env)
    inputs.update({f"c_{k}": v for k, v in constants.items()})
    with np.errstate(all="ignore"):
        return np.broadcast_to(evaluate_vector(compile_expression(test), inputs), (len(env),)) > 0.5


def _spans(test: ast.expr, env: Envelope) -> str:
    names = sorted({n.attr for n in ast.walk(test) if _is(n, "f")})
    column = lambda n: env.components[COMPONENT_INDEX[n]]  # noqa: E731
    return ", ".join(f"f.{n} spans {fmt(column(n).min(), 4)} to {fmt(column(n).max(), 4)}" for n in names)


def threshold_problems(program: Program, env: Envelope) -> Iterator[tuple[str, str]]:
    """(rule, message) for a condition of step_time that holds on every envelope step or on none,
    at the program's constants or at a bound of a constant it reads."""
    for test in conditions(program):
        shown = ast.unparse(test)
        settings = [("", dict(program.constants))]
        for name in sorted({n.attr for n in ast.walk(test) if _is(n, "c")}, key=list(program.constants).index):
            lo, hi = program.bounds.get(name, (-math.inf, math.inf))
            for side, value in (("min", lo), ("max", hi)):
                if not math.isfinite(value):
                    yield (
                        "threshold",
                        f"step_time's condition `{shown}` reads c.{name}, which has no {side}: a fit could move "
                        "it past every step users simulate; give it bounds inside the envelope's range of what "
                        f"it is compared with ({_spans(test, env)})",
                    )
                    return
                settings.append((f" with c.{name} at its {side} {value:g}", {**program.constants, name: value}))
        for where, constants in settings:
            holds = _holds(test, env, constants)
            if holds.all() or not holds.any():
                yield (
                    "threshold",
                    f"step_time's condition `{shown}`{where} is {bool(holds[0])} on every step of the envelope "
                    f"({_spans(test, env)}): its other branch is taken by no step users simulate nor any of the "
                    "data, so nothing fits or checks it; a threshold must lie inside the envelope's range",
                )
                return


def threshold_bounds(program: Program, env: Envelope) -> dict[str, tuple[float, float]]:
    """Bounds for the unbounded constants that only step_time's conditions read, each compared
    with one expression of the step's inputs: between that expression's two smallest values over
    the envelope and its two largest, so that the condition switches at either bound."""
    out: dict[str, tuple[float, float]] = {}
    for test in conditions(program):
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
            continue
        a, b = test.left, test.comparators[0]
        for constant, other in ((a, b), (b, a)):
            if not _is(constant, "c") or constant.attr in program.bounds:
                continue
            if any(_is(n, "c") for n in ast.walk(other)):
                continue
            values = np.unique(np.broadcast_to(evaluate_vector(compile_expression(other), _inputs(env)), (len(env),)))
            values = values[np.isfinite(values)]
            if len(values) >= 2:
                out[constant.attr] = (float(values[:2].mean()), float(values[-2:].mean()))
    return out


def _inputs(env: Envelope) -> dict[str, np.ndarray]:
    return {f"f_{name}": env.components[i] for name, i in COMPONENT_INDEX.items()}
