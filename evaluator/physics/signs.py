"""What a program's values can be, and which way its step moves as its work grows: the analysis
behind the rules that close the physics' back doors (rules.py).

Every input of a program is non-negative (f.* are times and counts of a step's work, r.* a
request's lengths and the step in flight), and under `--physics check` so is every constant read in a
value (a constant with no min is held at 0 or above). From these, `value_range` bounds every
subexpression by interval arithmetic over the constants' bounds (a literal is its value; the DSL's
protected operators as the operator table defines them: x/0 = 0, sqrt(|x|), log(|x|) with log(0) = 0,
|x| ** p for a non-integer p). A range also says whether the value is *whole* (0 or at least 1, as
counts are), because log of a whole value is never negative.

Two questions are asked of every function's value (step_time, queueing_time, output_token_time,
post_decode_time), each of its own rule:
  `negative_values`  where a time is added or scaled, is every term and factor non-negative? (no
                     negative constant, difference of constants, negative branch or log below 1: each
                     would subtract time through a back door the subtraction rule does not see)
  `polarity`         as a time component grows, does the value grow? (+1: never falls; -1: falls;
                     0: unknown, e.g. scaled by a factor of either sign or inside |x| of a value of
                     either sign). Conditions are not values: their nodes have no polarity.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from dataclasses import dataclass

from stepml_evolve.evaluator.dsl import Program
from stepml_evolve.evaluator.dsl.operators import EXP_CLAMP, literal_number
from stepml_evolve.evaluator.hardware.components import TIME_COMPONENTS

INF = math.inf


@dataclass(frozen=True)
class Range:
    """The values an expression can take: [lo, hi]; `whole`: only 0 or values >= 1."""

    lo: float
    hi: float
    whole: bool = False

    @property
    def nonnegative(self) -> bool:
        return self.lo >= 0

    @property
    def sign(self) -> int:
        """+1: never negative; -1: never positive; 0: either."""
        return 1 if self.lo >= 0 else -1 if self.hi <= 0 else 0

    def text(self) -> str:
        return f"[{_num(self.lo)}, {_num(self.hi)}]"


def _num(x: float) -> str:
    return ("inf" if x > 0 else "-inf") if math.isinf(x) else f"{x:.4g}"


NONNEGATIVE = Range(0.0, INF)
COUNT = Range(0.0, INF, whole=True)
ANY = Range(-INF, INF)


def _mul(a: float, b: float) -> float:
    return 0.0 if a == 0 or b == 0 else a * b  # an interval's end at 0 times an infinite one is 0


def _product(a: Range, b: Range) -> Range:
    ends = [_mul(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Range(min(ends), max(ends), a.whole and b.whole and a.lo >= 0 and b.lo >= 0)


def _quotient(a: Range, b: Range) -> Range:
    if b.lo > 0 or b.hi < 0:
        ends = [x / y for x in (a.lo, a.hi) for y in (b.lo, b.hi) if not (math.isinf(x) and math.isinf(y))]
        ends += [0.0] if any(math.isinf(y) for y in (b.lo, b.hi)) else []
        return Range(min(ends), max(ends))
    if a.lo >= 0 and b.lo >= 0:
        return NONNEGATIVE  # x / 0 is 0, and a non-negative over a positive is non-negative
    return ANY


def _power(base: Range, p: float) -> Range:
    if not float(p).is_integer():  # |x| ** p
        base = _absolute(base)
    elif int(p) % 2 == 0 and base.lo < 0:
        base = _absolute(base)
    if p == 0:
        return Range(1.0, 1.0, True)
    with_zero = base.lo <= 0 <= base.hi
    if p < 0 and with_zero:
        return ANY if base.lo < 0 else NONNEGATIVE
    ends = [x**p if not (x == 0 and p < 0) else INF for x in (base.lo, base.hi)]
    return Range(min(ends), max(ends), base.whole and p > 0 and float(p).is_integer())


def _absolute(r: Range) -> Range:
    if r.lo >= 0:
        return r
    if r.hi <= 0:
        return Range(-r.hi, -r.lo, r.whole)
    return Range(0.0, max(-r.lo, r.hi), r.whole)


def _log(r: Range) -> Range:
    a = _absolute(r)
    hi = math.log(a.hi) if a.hi > 0 else 0.0
    if a.whole or a.lo >= 1:
        return Range(math.log(a.lo) if a.lo >= 1 else 0.0, max(hi, 0.0))
    return Range(-INF, max(hi, 0.0))


def constant_range(program: Program, name: str) -> Range:
    """A constant's range under `--physics check`: its bounds, with no min held at 0."""
    lo, hi = program.bounds.get(name, (-INF, INF))
    return Range(0.0 if lo == -INF else lo, hi)


def _is(node: ast.AST, base: str, names=None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == base
        and (names is None or node.attr in names)
    )


class Ranges:
    """`value_range` of every node of one inlined expression (memoized by node)."""

    def __init__(self, program: Program):
        self.program = program
        self._seen: dict[int, Range] = {}

    def __call__(self, node: ast.AST) -> Range:
        key = id(node)
        if key not in self._seen:
            self._seen[key] = self._range(node)
        return self._seen[key]

    def _range(self, node: ast.AST) -> Range:
        if (v := literal_number(node)) is not None:
            return Range(v, v, v == 0 or (v >= 1 and float(v).is_integer()))
        if _is(node, "f"):
            return NONNEGATIVE if node.attr in TIME_COMPONENTS else COUNT
        if _is(node, "r"):
            return NONNEGATIVE if node.attr.endswith("_us") else COUNT
        if _is(node, "c"):
            return constant_range(self.program, node.attr)
        if isinstance(node, ast.BinOp):
            a, op = self(node.left), type(node.op)
            if op is ast.Pow:
                return _power(a, literal_number(node.right))
            b = self(node.right)
            if op is ast.Add:
                return Range(a.lo + b.lo, a.hi + b.hi, a.whole and b.whole and a.lo >= 0 and b.lo >= 0)
            if op is ast.Sub:
                return Range(a.lo - b.hi, a.hi - b.lo)
            if op is ast.Mult:
                return _product(a, b)
            if op is ast.Div:
                return _quotient(a, b)
        if isinstance(node, ast.UnaryOp):
            a = self(node.operand)
            return Range(-a.hi, -a.lo, a.whole and a.lo == 0 and a.hi == 0) if isinstance(node.op, ast.USub) else a
        if isinstance(node, ast.Call):
            args = [self(a) for a in node.args]
            name = node.func.id
            if name == "max":
                return Range(max(a.lo for a in args), max(a.hi for a in args), all(a.whole for a in args))
            if name == "min":
                return Range(min(a.lo for a in args), min(a.hi for a in args), all(a.whole for a in args))
            if name == "abs":
                return _absolute(args[0])
            if name == "sqrt":
                a = _absolute(args[0])
                return Range(math.sqrt(a.lo), math.sqrt(a.hi))
            if name == "log":
                return _log(args[0])
            if name == "exp":
                a = args[0]
                return Range(math.exp(min(a.lo, EXP_CLAMP)), math.exp(min(a.hi, EXP_CLAMP)))
        if isinstance(node, ast.IfExp):
            a, b = self(node.body), self(node.orelse)
            return Range(min(a.lo, b.lo), max(a.hi, b.hi), a.whole and b.whole)
        return ANY  # conditions and anything unforeseen: no claim


def value_constants(expr: ast.AST) -> set[str]:
    """The constants read in a value of `expr` (not only inside conditions)."""
    out: set[str] = set()

    def walk(node: ast.AST) -> None:
        if isinstance(node, (ast.Compare, ast.BoolOp)):
            return
        if _is(node, "c"):
            out.add(node.attr)
        if isinstance(node, ast.IfExp):
            walk(node.body)
            walk(node.orelse)
            return
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(expr)
    return out


def negative_constants(program: Program, names: set[str]) -> Iterator[tuple[str, str]]:
    """(constant, what of it is negative) for each of `names` whose start, bounds or prior is."""
    for name in sorted(names, key=list(program.constants).index):
        lo, hi = program.bounds.get(name, (-INF, INF))
        prior = program.priors.get(name)
        parts = [f"start {program.constants[name]:g}"] if program.constants[name] < 0 else []
        parts += [f"min {lo:g}"] if -INF < lo < 0 else []
        parts += [f"max {hi:g}"] if hi < 0 else []
        parts += [f"prior {prior.centre:g}"] if prior is not None and prior.centre < 0 else []
        if parts:
            yield name, ", ".join(parts)


def _has_input(node: ast.AST) -> bool:
    return any(_is(n, "f") or _is(n, "r") for n in ast.walk(node))


FOLDS = "folds: "  # how a `negative_values` reason for abs, sqrt or log of a value of either sign begins


def negative_values(expr: ast.AST, ranges: Ranges) -> Iterator[tuple[ast.AST, str]]:
    """(node, why) for each term or factor of the value that may be negative where the value needs
    it not to be: the value itself, a sum's terms, a product's or quotient's operands, a power's
    base, both branches of an if-else, and at least one argument of max (max(0, x - k) is a hinge:
    its other argument is free); and the arguments of abs, sqrt and log, which fold a negative value
    back up (their reason begins with FOLDS). A difference of constants is named as one."""

    def need(node: ast.AST) -> Iterator[tuple[ast.AST, str]]:
        r = ranges(node)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            if not r.nonnegative:
                what = "a difference of constants" if not _has_input(node) else "a difference"
                yield node, f"{what}, which ranges over {r.text()}"
                return
            yield from need(node.left)
            yield from need(node.right)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            yield from need(node.left)
        elif isinstance(node, ast.BinOp):
            yield from need(node.left)
            yield from need(node.right)
        elif isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub) and not r.nonnegative:
                yield node, f"a negated value, which ranges over {r.text()}"
                return
            yield from need(node.operand)
        elif isinstance(node, ast.Call):
            name = node.func.id
            if name == "max":
                held = [a for a in node.args if ranges(a).nonnegative]
                if not held:
                    yield node, f"a max of values that may all be negative ({r.text()})"
                for a in held:
                    yield from need(a)
            elif name == "exp":
                return  # exp is positive whatever its argument (polarity still reads it)
            else:
                if name == "log" and not r.nonnegative and ranges(node.args[0]).nonnegative:
                    yield node, "the log of a value that may lie between 0 and 1 (negative there)"
                    return
                if name in ("abs", "sqrt", "log") and not (arg := ranges(node.args[0])).nonnegative:
                    yield node, f"{FOLDS}{name} of a value that ranges over {arg.text()}"
                    return
                for a in node.args:
                    yield from need(a)
        elif isinstance(node, ast.IfExp):
            yield from need(node.body)
            yield from need(node.orelse)
        elif not r.nonnegative:
            yield node, f"a value that ranges over {r.text()}"

    yield from need(expr)


def polarity(expr: ast.AST, ranges: Ranges) -> dict[int, int]:
    """Which way `expr` moves as each node's value grows (by id(node)): +1 it never falls, -1 it
    never rises, 0 either; nodes inside a condition are left out (a branch's test is no value)."""
    out: dict[int, int] = {}

    def walk(node: ast.AST, s: int) -> None:
        out[id(node)] = s
        if isinstance(node, ast.BinOp):
            op = type(node.op)
            if op is ast.Add:
                walk(node.left, s)
                walk(node.right, s)
            elif op is ast.Sub:
                walk(node.left, s)
                walk(node.right, -s)
            elif op is ast.Mult:
                walk(node.left, s * ranges(node.right).sign)
                walk(node.right, s * ranges(node.left).sign)
            elif op is ast.Div:
                walk(node.left, s * ranges(node.right).sign)
                walk(node.right, -s * ranges(node.left).sign)
            elif op is ast.Pow:
                p, base = literal_number(node.right), ranges(node.left)
                walk(node.left, s if p == 0 else 0 if base.sign <= 0 else s if p > 0 else -s)
        elif isinstance(node, ast.UnaryOp):
            walk(node.operand, -s if isinstance(node.op, ast.USub) else s)
        elif isinstance(node, ast.Call):
            name, arg = node.func.id, ranges(node.args[0])
            if name in ("max", "min", "exp"):
                inner = s
            elif name == "log":
                inner = s if arg.nonnegative and (arg.whole or arg.lo >= 1) else 0
            else:  # abs, sqrt: of |x|, monotone only where x keeps one sign
                inner = s * arg.sign
            for a in node.args:
                walk(a, inner)
        elif isinstance(node, ast.IfExp):
            walk(node.body, s)
            walk(node.orelse, s)

    walk(expr, 1)
    return out


def falling_times(expr: ast.AST, ranges: Ranges) -> Iterator[tuple[ast.Attribute, int]]:
    """(f.T, its polarity) of every time component the value does not grow with (-1: falls, 0: may
    fall), outside conditions."""
    signs = polarity(expr, ranges)
    for node in ast.walk(expr):
        if _is(node, "f", TIME_COMPONENTS) and id(node) in signs and signs[id(node)] != 1:
            yield node, signs[id(node)]


def has_branches(expr: ast.AST) -> bool:
    return any(isinstance(n, ast.IfExp) for n in ast.walk(expr))


def lowest_branch(expr: ast.AST, ranges: Ranges) -> ast.AST:
    """`expr` (a fresh tree: it is rewritten in place) with every `a if cond else b` replaced by
    whichever branch makes the value lowest wherever a user sends it: min(a, b) where the value grows
    with the branch, max(a, b) where it falls; where it may do either, the branch stays as written.
    On every input, no choice of branches gives a value below this one's, so a floor checked on it
    holds for each branch on its own."""
    signs = polarity(expr, ranges)

    class Lowest(ast.NodeTransformer):
        def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
            s = signs.get(id(node), 0)
            self.generic_visit(node)
            if s == 0:
                return node
            return ast.Call(
                func=ast.Name(id="min" if s > 0 else "max", ctx=ast.Load()), args=[node.body, node.orelse], keywords=[]
            )

    return ast.fix_missing_locations(Lowest().visit(expr))
