"""Physics a program may not trade away: what `--physics check` (the default) asks of every new
program (a seed, a search's child, a program `evolve fit` is given), beyond what the DSL parses.

  causal  inputs that cause the time. Each function reads only what can cause its duration
          (CAUSAL_READS; the DSL docs carry the table): queueing_time does not read
          r.output_tokens, and a term for a feature some deployments lack is zero where it is
          absent: step_time is the same at TP 1 as with no tensor parallelism at all (f.allreduce
          is, k * f.tp is not). f.experts needs no check: it is 0 for a dense model, so a term in
          it is zero there by construction.
  floor   no FLOP or HBM time counts at the hardware's peak (every one is scaled by an efficiency
          constant: no kernel reaches the peak, and a child that drops the constant would run
          prefill at it); no time component is subtracted (or divides, or enters with a negative power): a step
          cannot get faster for doing more of a kind of work; each constant has one role, in one
          function (a constant that scales one resource's time, FLOP, HBM or link time, in one
          place is not read as another's, inside sqrt, beside a count or in a condition in
          another, nor shared between step_time and queueing_time);
          and step_time is at or above the physical floor everywhere in the envelope (floor.py).

The parser (dsl/program.py) keeps accepting what these rules refuse, so programs stored before
them still read, browse and emit; the rules apply where a program enters a search or a fit.
"""

from __future__ import annotations

import ast
import copy
import math
from collections.abc import Iterator

import numpy as np

from stepml_evolve.evaluator.dsl import Program, ProgramError
from stepml_evolve.evaluator.dsl.numexpr_compile import compile_vector, evaluate_vector
from stepml_evolve.evaluator.dsl.operators import literal_number
from stepml_evolve.evaluator.dsl.program import Prior, clip_to, prior_kind
from stepml_evolve.evaluator.physics.components import COMPONENT_INDEX, TIME_COMPONENTS
from stepml_evolve.evaluator.soundness.floor import Envelope, check_floor, envelope_for

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


def inherit(child: Program, parent: Program) -> Program:
    """The child with its first parent's bounds and prior on every constant it inherits (by name:
    a child may not loosen what holds its parent's constants), and on every constant it adds a prior
    (its own, else `default_prior`) and, where it scales a time (`c.k * f.kv_read`) and has no
    bounds, a min of 0 (a negative one would subtract that work); values moved into the bounds."""
    bounds, priors, values = {}, {}, {}
    scales_time = _scales_time(child)
    for name, value in child.constants.items():
        if name in parent.constants:
            b, p = parent.bounds.get(name), parent.priors.get(name)
        else:
            b = child.bounds.get(name) or ((0.0, math.inf) if name in scales_time else None)
            p = child.priors.get(name) or default_prior(clip_to(value, b), b)
        if b is not None:
            bounds[name] = b
        if p is not None:
            priors[name] = p
        values[name] = clip_to(value, b)
    if bounds == child.bounds and priors == child.priors and values == child.constants:
        return child
    return child.with_constants(values, bounds=bounds, priors=priors)


def _scales_time(program: Program) -> set[str]:
    """The constants every occurrence of which scales a time (a product with a time component or a
    step's time, summed into a value)."""
    roles: dict[str, set] = {}
    for name, fn in program.functions.items():
        expr = inlined(fn)
        parents = _parents(expr)
        for node in ast.walk(expr):
            if _is(node, "c"):
                roles.setdefault(node.attr, set()).add(_role(node, parents, name))
    return {
        k
        for k, rs in roles.items()
        if all(where == "a value" and multiplies not in ("a count", "nothing") for _, multiplies, where in rs)
    }


def inlined(fn: ast.FunctionDef) -> ast.expr:
    """The function's return expression with its locals substituted (a fresh tree)."""
    locals_: dict[str, ast.expr] = {}

    class Substitute(ast.NodeTransformer):
        def visit_Name(self, node):
            return copy.deepcopy(locals_[node.id]) if node.id in locals_ else node

    for stmt in fn.body:
        if isinstance(stmt, ast.Assign):
            locals_[stmt.targets[0].id] = Substitute().visit(copy.deepcopy(stmt.value))
        elif isinstance(stmt, ast.Return):
            return Substitute().visit(copy.deepcopy(stmt.value))
    raise ValueError(f"{fn.name} has no return")  # the validator makes this impossible


def _is(node: ast.AST, base: str, names=None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == base
        and (names is None or node.attr in names)
    )


def _negative_literal(node: ast.AST) -> bool:
    v = literal_number(node)
    return v is not None and v < 0


def _decreasing_time(node: ast.AST, sign: int = 1) -> Iterator[ast.Attribute]:
    """The time components f.T under `node` that the value falls as they grow (polarity through
    + - * / ** and unary minus; a negative literal factor flips it; calls keep it; conditions do
    not count)."""
    if _is(node, "f", TIME_COMPONENTS):
        if sign < 0:
            yield node
    elif isinstance(node, ast.BinOp):
        op = type(node.op)
        if op is ast.Add:
            yield from _decreasing_time(node.left, sign)
            yield from _decreasing_time(node.right, sign)
        elif op is ast.Sub:
            yield from _decreasing_time(node.left, sign)
            yield from _decreasing_time(node.right, -sign)
        elif op is ast.Mult:
            yield from _decreasing_time(node.left, -sign if _negative_literal(node.right) else sign)
            yield from _decreasing_time(node.right, -sign if _negative_literal(node.left) else sign)
        elif op is ast.Div:
            yield from _decreasing_time(node.left, -sign if _negative_literal(node.right) else sign)
            yield from _decreasing_time(node.right, -sign)
        elif op is ast.Pow:
            p = literal_number(node.right)
            yield from _decreasing_time(node.left, sign if p is not None and p > 0 else -sign)
    elif isinstance(node, ast.UnaryOp):
        yield from _decreasing_time(node.operand, -sign if isinstance(node.op, ast.USub) else sign)
    elif isinstance(node, ast.Call):
        for a in node.args:
            yield from _decreasing_time(a, sign)
    elif isinstance(node, ast.IfExp):
        yield from _decreasing_time(node.body, sign)
        yield from _decreasing_time(node.orelse, sign)


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
        for node in _decreasing_time(expr):
            yield (
                "floor",
                f"{name} subtracts f.{node.attr} (or falls as it grows): a step cannot get faster for "
                "doing more of that work",
            )
            break
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
