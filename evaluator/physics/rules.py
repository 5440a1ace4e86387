"""Physics a program may not trade away: what `--physics check` (the default) asks of every new
program (a seed, a search's child, a program `evolve fit`, `cv` or `emit-go` is given), beyond
what the DSL parses. Each rule is one line of refusal, naming where the program breaks it.

  causal     inputs that cause the time. Each function reads only what can cause its duration
             (CAUSAL_READS; the DSL docs carry the table): queueing_time does not read
             r.output_tokens, and a term for a feature some deployments lack is zero where it is
             absent: step_time is the same at TP 1 as with no tensor parallelism at all (f.allreduce
             is, k * f.tp is not). f.experts needs no check: it is 0 for a dense model, so a term in
             it is zero there by construction.
  floor      no FLOP or HBM time counts at the hardware's peak (every one is scaled by an efficiency
             constant: no kernel reaches the peak, and a child that drops the constant would run
             prefill at it); no time component is subtracted, divides, enters with a negative power or
             is scaled by a factor of either sign (signs.polarity): a step cannot get faster for doing
             more of a kind of work; each constant has one role, in one function (a constant that
             scales one resource's time, FLOP, HBM or link time, in one place is not read as another's,
             inside sqrt, beside a count or in a condition in another, nor shared between step_time and
             queueing_time); and step_time, each branch of a condition on its own, is at or above the
             physical floor everywhere in the envelope (floor.py).
  sign       nothing takes time away through a back door (signs.py): a constant read in a value is
             >= 0 (its start, min, max and prior; with no min the fit holds it at 0 or above:
             `held_bounds`), and every term and factor of a time is >= 0 wherever its constants'
             bounds let it go: no difference of constants, negative branch, negated value or log of a
             value below 1 (a hinge is max(0, x - k), whose other argument is free).
  twice      no time component is counted twice in one sum (`c.a * (f.gemm_pf + f.attn_pf) +
             c.b * f.gemm_pf`): one step does that work once. A search's child has such terms merged
             by the simplifier first (evolve/search/simplify.py) where they differ only in a constant.
  threshold  every condition of step_time switches inside the envelope, at the program's constants
             and at the bounds of the constants it reads (thresholds.py).

The parser (dsl/program.py) keeps accepting what these rules refuse, so programs stored before
them still read and browse; the rules apply where a program enters a search, a fit or emission,
and the replay under --physics check fails at any step below its floor, naming it.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator

import numpy as np

from stepml_evolve.evaluator.dsl import Program, ProgramError
from stepml_evolve.evaluator.dsl.numexpr_compile import compile_vector, evaluate_vector
from stepml_evolve.evaluator.dsl.program import Prior, clip_to, inlined, prior_kind
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX, TIME_COMPONENTS
from stepml_evolve.evaluator.physics.floor import Envelope, check_floor, envelope_for
from stepml_evolve.evaluator.physics.signs import (
    FOLDS,
    Ranges,
    falling_times,
    negative_constants,
    negative_values,
    value_constants,
)
from stepml_evolve.evaluator.physics.thresholds import threshold_bounds, threshold_problems

# What each function may read, and why (the DSL docs' table). Anything a function's parameters
# give that is not listed is not causal, with its reason in NOT_CAUSAL.
CAUSAL_READS = {
    "step_time": (
        "every component f.* (FLOP and byte times of the step's batch at peak, its counts); f.tp only "
        "in a term that is 0 at TP 1 (f.experts is 0 for a dense model, so a term in it is 0 there)"
    ),
    "queueing_time": (
        "r.input_tokens (the prompt is tokenized and its blocks looked up before the request can be "
        "scheduled) and r.last_step_us (the step in flight, which the request waits out)"
    ),
    "output_token_time": "constants only (detokenizing and streaming one token)",
    "post_decode_time": "constants only (finishing a request)",
}
NOT_CAUSAL = {
    ("queueing_time", "r", "output_tokens"): (
        "the server does not know how many tokens a request will generate when it queues it; where "
        "every request of a workload asks for one length (as in the real data), a term in it reads "
        "the workload, not a cause, and extrapolates a correlation to other output lengths"
    ),
}
# the resource each time component's time is spent on: a constant that scales one resource's time
# (an efficiency) is not read as another's
RESOURCE = {
    "gemm_pf": "FLOP time",
    "gemm_dc": "FLOP time",
    "attn_pf": "FLOP time",
    "attn_dc": "FLOP time",
    "weights": "HBM time",
    "kv_read": "HBM time",
    "kv_write": "HBM time",
    "allreduce": "link time",
}
ABSENCE_TOLERANCE_US = 1e-6  # a feature's term counts as absent when it moves a step by less than this
PERTURBED = (1.3, 0.7)  # the constants are also tried at value * 1.3 + 0.7: a zero is no coincidence


# A constant the search adds (symbolic operators start it where it adds a typical amount; an LLM
# where it sees fit) gets this weak prior around its start: a factor of 10 is one spread
DEFAULT_SPREAD = math.log(10.0)


def default_prior(start: float, bounds: tuple[float, float] | None) -> Prior:
    """The weak prior of a new constant: centred on its start, a factor of 10 a spread (relative),
    or 10 times its size (absolute, for a start <= 0 or a negative min)."""
    lo = bounds[0] if bounds else -math.inf
    if prior_kind(start, lo):
        return Prior(start, DEFAULT_SPREAD, True)
    return Prior(start, 10.0 * max(abs(start), 1.0), False)


def inherit(child: Program, parent: Program, env: Envelope | None = None) -> Program:
    """The child with its first parent's bounds and prior on every constant it inherits (by name:
    a child may not loosen what holds its parent's constants), and on every constant it adds a prior
    (its own, else `default_prior`) and, where it has no bounds, a min of 0 if a value reads it (a
    negative one would take time away) or, given the envelope, bounds inside the range of what a
    condition of step_time compares it with (thresholds.threshold_bounds); values moved into the
    bounds."""
    bounds, priors, values = {}, {}, {}
    in_values = _value_constants(child)
    at_thresholds = threshold_bounds(child, env) if env is not None else {}
    for name, value in child.constants.items():
        if name in parent.constants:
            b, p = parent.bounds.get(name), parent.priors.get(name)
        else:
            b = child.bounds.get(name) or ((0.0, math.inf) if name in in_values else at_thresholds.get(name))
            p = child.priors.get(name) or default_prior(clip_to(value, b), b)
        if b is not None:
            bounds[name] = b
        if p is not None:
            priors[name] = p
        values[name] = clip_to(value, b)
    if bounds == child.bounds and priors == child.priors and values == child.constants:
        return child
    return child.with_constants(values, bounds=bounds, priors=priors)


def _value_constants(program: Program) -> set[str]:
    """The constants read in a value of any function (not only in a condition)."""
    return set().union(*(value_constants(inlined(fn)) for fn in program.functions.values()))


def held_bounds(program: Program) -> dict[str, tuple[float, float]]:
    """The bounds a fit under --physics check holds the constants in: each one's own, with a min of
    0 for a constant a value reads that has none (a negative one would take time away)."""
    held = dict(program.bounds)
    for name in _value_constants(program):
        lo, hi = held.get(name, (-math.inf, math.inf))
        if lo == -math.inf:
            held[name] = (0.0, hi)
    return held


def _is(node: ast.AST, base: str, names=None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == base
        and (names is None or node.attr in names)
    )


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _role(node: ast.Attribute, parents: dict[int, ast.AST], function: str) -> tuple[str, str, str]:
    """What a constant's occurrence does: (function, what it multiplies, where that product goes).
    It multiplies its product chain's other factors (a time, a count, both, or nothing); the chain
    ends in a value (a sum, max, min, a branch, the return), a condition, a function's argument,
    a power or a divisor."""
    factors: list[ast.AST] = []
    cur = node
    while True:
        parent = parents.get(id(cur))
        if isinstance(parent, ast.UnaryOp):
            cur = parent
        elif isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mult):
            factors.append(parent.right if parent.left is cur else parent.left)
            cur = parent
        elif isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div) and parent.left is cur:
            factors.append(parent.right)
            cur = parent
        else:
            break
    times, counts = set(), False
    for f in factors:
        for n in ast.walk(f):
            if _is(n, "f"):
                if n.attr in TIME_COMPONENTS:
                    times.add(RESOURCE[n.attr])
                else:
                    counts = True
            elif _is(n, "r"):
                if n.attr.endswith("_us"):
                    times.add("a step's time")
                else:
                    counts = True
    # what it scales: the times of which resources (an efficiency of one is not another's); a count
    # beside a time only says how many times (padded / n, a batch's share): still that time's scale
    multiplies = " and ".join(sorted(times)) if times else "a count" if counts else "nothing"
    if isinstance(parent, ast.IfExp):
        where = "a condition" if parent.test is cur else "a value"
    elif isinstance(parent, ast.Call):
        name = parent.func.id if isinstance(parent.func, ast.Name) else "?"
        where = "a value" if name in ("max", "min") else f"{name}()"
    elif isinstance(parent, (ast.Compare, ast.BoolOp, ast.UnaryOp)):
        where = "a condition"
    elif isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Pow):
        where = "a power"
    elif isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div):
        where = "a divisor"
    else:  # a sum's operand, or the return itself
        where = "a value"
    return function, multiplies, where


def _role_text(role: tuple[str, str, str]) -> str:
    function, multiplies, where = role
    return f"in {function}, multiplying {multiplies}, in {where}"


AT_PEAK_EXEMPT = ("allreduce",)  # link time at peak: the seeds' simplification (small next to the step)


def _at_peak(expr: ast.expr, parents: dict[int, ast.AST]) -> Iterator[ast.Attribute]:
    """The FLOP and HBM time components no constant scales: walking up from one, no product (or
    quotient) on the way has a constant in its other operand."""
    for node in ast.walk(expr):
        if not _is(node, "f", TIME_COMPONENTS) or node.attr in AT_PEAK_EXEMPT:
            continue
        cur, scaled = node, False
        while (parent := parents.get(id(cur))) is not None and not scaled:
            if isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Mult, ast.Div)):
                other = parent.right if parent.left is cur else parent.left
                scaled = any(_is(n, "c") for n in ast.walk(other))
            cur = parent
        if not scaled:
            yield node


NOT_WORK = ("tp",)  # a degree of the deployment, not work the step does: `f.allreduce * (1 + k * f.tp)` is fine


def _counts_in_value(expr: ast.AST) -> Iterator[ast.Attribute]:
    """The count components (f.* that are not times) an expression grows with: not those in a
    divisor (a share per count) or a condition (a branch's test)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        yield from _counts_in_value(expr.left)
        return
    if isinstance(expr, ast.IfExp):
        yield from _counts_in_value(expr.body)
        yield from _counts_in_value(expr.orelse)
        return
    if isinstance(expr, (ast.Compare, ast.BoolOp)):
        return
    if _is(expr, "f") and expr.attr not in TIME_COMPONENTS and expr.attr not in NOT_WORK:
        yield expr
        return
    for child in ast.iter_child_nodes(expr):
        yield from _counts_in_value(child)


def _carries_time(parent: ast.AST, child: ast.AST) -> bool:
    """Whether `parent` passes a time its operand `child` holds on as a time: a sum, a difference, a
    sign, a quotient, max/min, a branch's value (not its test), so a count that multiplies any of
    them multiplies the time too."""
    if isinstance(parent, (ast.UnaryOp, ast.BinOp)):
        return not isinstance(parent, ast.BinOp) or isinstance(parent.op, (ast.Add, ast.Sub, ast.Div))
    if isinstance(parent, ast.Call):
        return isinstance(parent.func, ast.Name) and parent.func.id in ("max", "min")
    return isinstance(parent, ast.IfExp) and parent.test is not child


def _time_times_count(expr: ast.expr, parents: dict[int, ast.AST]) -> Iterator[tuple[ast.Attribute, ast.Attribute]]:
    """(time, count) where a time component is multiplied by a count: walking up from the time
    through what carries it (`_carries_time`), a product whose other operand grows with a count."""
    for node in ast.walk(expr):
        if not _is(node, "f", TIME_COMPONENTS):
            continue
        cur = node
        while (parent := parents.get(id(cur))) is not None:
            if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mult):
                other = parent.right if parent.left is cur else parent.left
                count = next(_counts_in_value(other), None)
                if count is not None:
                    yield node, count
                    break
            elif not _carries_time(parent, cur):
                break
            cur = parent


def _shown(node: ast.AST, limit: int = 80) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sign_problems(program: Program, function: str, expr: ast.expr) -> Iterator[tuple[str, str]]:
    """No time subtracted through a back door: no negative constant, no term or factor of a time
    that may be negative (a difference of constants, a negative branch, a log below 1), no time
    component the value falls with (subtracted, dividing, scaled by a factor of either sign), no
    component counted twice in one sum."""
    ranges = Ranges(program)
    for name, what in negative_constants(program, value_constants(expr)):
        yield (
            "sign",
            f"c.{name} may be negative ({what}) in {function}: a constant read in a value scales or adds "
            "a time, and a negative one takes time away; its start, min, max and prior must be >= 0 (a "
            "constant with no min is held at 0 or above)",
        )
        return
    falling = list(falling_times(expr, ranges))
    for node, sign in sorted(falling, key=lambda fs: fs[1]):  # one that surely falls first
        if sign < 0 or not any(True for _ in negative_values(expr, ranges)):
            yield (
                "floor",
                f"{function} {'subtracts' if sign < 0 else 'may fall with'} f.{node.attr} (the step falls as "
                f"f.{node.attr} grows{'' if sign < 0 else ', for some constants'}): a step cannot get faster for "
                "doing more of that work",
            )
            return
        break
    for node, why in negative_values(expr, ranges):
        if why.startswith(FOLDS):
            message = (
                f"{function} takes `{_shown(node)}`, the {why.removeprefix(FOLDS)}: it folds the negative side "
                "back up, so the step falls, then rises, as that value grows (a hinge is written max(0, x - k))"
            )
        else:
            message = (
                f"{function} adds or scales a time by `{_shown(node)}`, {why}: a term or factor of a time that "
                "can be negative takes time away, as a subtracted time does (a hinge is written max(0, x - k))"
            )
        yield "sign", message
        return
    for component, terms in counted_twice(expr):
        yield (
            "twice",
            f"{function} counts f.{component} twice in one sum (in `{_shown(terms[0], 50)}` and "
            f"`{_shown(terms[1], 50)}`): one step does that work once; give each part of it its own "
            "component, or one efficiency",
        )
        return


def _summed(node: ast.AST) -> Iterator[str]:
    """The time components a term adds as themselves: through sums, products, quotients' numerators
    and signs; not through max, min, a function, a branch or a power, each a time of its own, nor
    through a quotient by a step's count (`f.gemm_pf / f.tokens`: a time per token, a tile's padding
    per token, is not the GEMM again)."""
    if _is(node, "f", TIME_COMPONENTS):
        yield node.attr
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        yield from _summed(node.left)
        yield from _summed(node.right)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        if not any(_is(n, "f") for n in ast.walk(node.right)):
            yield from _summed(node.left)
    elif isinstance(node, ast.UnaryOp):
        yield from _summed(node.operand)


def _sum_terms(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return _sum_terms(node.left) + _sum_terms(node.right)
    return [node]


def summed_times(expr: ast.AST) -> set[str]:
    """The time components the top-level sum of `expr` adds as themselves: a term that adds one of
    them again counts it twice."""
    return {c for term in _sum_terms(expr) for c in _summed(term)}


def counted_twice(expr: ast.AST) -> Iterator[tuple[str, tuple[ast.AST, ast.AST]]]:
    """(component, the two terms) where one sum (a chain of + and -) has a time component in two of
    its terms, each adding it as itself (`c.a * (f.gemm_pf + f.attn_pf) + c.b * f.gemm_pf`)."""
    parents = _parents(expr)
    for node in ast.walk(expr):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Add, ast.Sub)):
            continue  # not the top of its chain
        first: dict[str, ast.AST] = {}
        for term in _sum_terms(node):
            for component in set(_summed(term)):
                if component in first:
                    yield component, (first[component], term)
                    return
                first[component] = term


def _form_problems(program: Program) -> Iterator[tuple[str, str]]:
    """(rule, message) of what the program reads or computes against the static rules."""
    roles: dict[str, dict[tuple[str, str, str], int]] = {}
    for name, fn in program.functions.items():
        for node in ast.walk(fn):
            for (function, base, attr), why in NOT_CAUSAL.items():
                if name == function and _is(node, base, (attr,)):
                    yield (
                        "causal",
                        f"line {node.lineno}: {function} reads {base}.{attr}, which cannot cause its time: {why}",
                    )
        expr = inlined(fn)
        yield from _sign_problems(program, name, expr)
        parents = _parents(expr)
        for node in ast.walk(expr):
            if _is(node, "c"):
                roles.setdefault(node.attr, {}).setdefault(_role(node, parents, name), 0)
        for time, count in _time_times_count(expr, parents):
            yield (
                "floor",
                f"{name} multiplies f.{time.attr} by f.{count.attr}: a time component is already the whole "
                "step's time for that work (summed over its tokens, requests and layers), so a count "
                "multiplies it again; scale it by a constant, or divide it by a count for a share",
            )
            break
        for node in _at_peak(expr, parents):
            yield (
                "floor",
                f"{name} counts f.{node.attr} at the hardware's peak (no constant scales it): no kernel runs at "
                "the peak, so a FLOP or HBM time takes an efficiency constant, and its prior, as the seeds' do",
            )
            break
    for constant, seen in roles.items():
        if len(seen) > 1:
            first, second = list(seen)[:2]
            yield (
                "floor",
                f"c.{constant} is read in two roles ({_role_text(first)}; {_role_text(second)}): a constant "
                "means one thing, so a new term takes a constant of its own",
            )


def _step_times(program: Program, components: np.ndarray, constants: np.ndarray) -> np.ndarray:
    vf = compile_vector(program, "step_time")
    inputs = {f"f_{n}": components[i] for n, i in COMPONENT_INDEX.items()}
    inputs.update({f"c_{k}": constants[j] for j, k in enumerate(program.constants)})
    with np.errstate(all="ignore"):
        return evaluate_vector(vf, inputs)


def _absence_problems(program: Program, env: Envelope) -> Iterator[tuple[str, str]]:
    """A term for tensor parallelism that charges deployments without it: step_time at TP 1 must be
    what it is with f.tp = 0 (no TP at all), as f.allreduce is 0 at both."""
    used = program.component_uses
    vectors = [np.array(list(program.constants.values()), dtype=float)]
    vectors.append(vectors[0] * PERTURBED[0] + PERTURBED[1])
    tp = env.components[COMPONENT_INDEX["tp"]]
    if used["tp"]:
        at_one = np.flatnonzero(tp == 1)
        without = env.components[:, at_one].copy()
        without[COMPONENT_INDEX["tp"]] = 0.0
        for v in vectors:
            diff = np.abs(_step_times(program, env.components[:, at_one], v) - _step_times(program, without, v))
            bad = np.flatnonzero(~(diff <= ABSENCE_TOLERANCE_US))
            if len(bad):
                i = int(at_one[bad[0]])
                yield (
                    "causal",
                    f"step_time charges deployments without tensor parallelism through f.tp (at {env.describe(i)} "
                    "it is not what it is with no TP at all): write a TP term so that it is 0 at TP 1, as "
                    "f.allreduce is (a factor of f.allreduce, or k * log(f.tp))",
                )
                return


def physics_problems(program: Program, env: Envelope | None = None) -> list[tuple[str, str]]:
    """(rule, message) of every rule the program breaks, the static ones first, the floor (at the
    program's own constants) last; [] for a sound program."""
    env = env or envelope_for()
    problems = list(_form_problems(program))
    problems += list(threshold_problems(program, env))
    problems += list(_absence_problems(program, env))
    floor = check_floor(program, env=env)
    if not floor.ok:
        problems.append(("floor", floor.reason()))
    return problems


def check_physics(program: Program, env: Envelope | None = None, origin: str = "") -> None:
    """Raise the first of `physics_problems` as a ProgramError (its rule, one line)."""
    problems = physics_problems(program, env)
    if problems:
        rule, message = problems[0]
        raise ProgramError(None, rule, message, origin)
