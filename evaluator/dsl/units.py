"""Units, as PySR's dimensional constraints: every value of a program is a power of microseconds,
and every DSL function returns a time.

A unit is us^k: k = 1 a time, k = 0 a count (dimensionless), k = 2 us^2, k = 1/2 sqrt(us).
Components carry theirs (`COMPONENTS` in evaluator/hardware/components.py: "us" or "count"); request
fields r.input_tokens and r.output_tokens are counts, r.last_step_us a time. Each operator's rule is the `units` column of
its row in operators.py (UNIT_RULES there says what each means): a + b, a - b, max, min, the two
sides of a comparison and the two branches of an if-else need one unit; a * b adds exponents,
a / b subtracts them, a ** p multiplies by p, sqrt halves; log and exp take and give counts. A
local has the unit of its expression. step_time, queueing_time, output_token_time and
post_decode_time must each return a time.

A fitted constant may carry any unit, as in PySR, with one difference: a named constant has one
value, so it has one unit wherever it appears. Each c.x is an unknown exponent that its uses solve
for (`return c.k * f.n_req` makes c.k microseconds per request; `c.k * f.gemm_pf + c.k * f.n_req`
asks c.k for two units at once and is rejected). A numeric literal is an unknown of its own at each
occurrence (`2 * f.gemm_pf + 2 * f.n_req` is fine). Every rule is linear in the exponents, so
checking a program is solving a linear system over the rationals, one equation at a time in source
order (functions as written, statements top to bottom, operands left to right, each function's
return last): the first equation that contradicts the earlier ones is the rejection, a ProgramError
with rule "units" naming the line, the operation and the two units.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fractions import Fraction

from stepml_evolve.evaluator.dsl.operators import Operator, literal_number, operands, operator_of
from stepml_evolve.evaluator.dsl.program import FUNCTIONS, REQUEST_FIELDS, Program, ProgramError
from stepml_evolve.evaluator.hardware.components import COMPONENTS

RULE = "units"
COUNT, TIME = 0, 1  # exponents of microseconds
_COMPONENT_UNIT_NAMES = {"us": TIME, "count": COUNT}  # the unit column of COMPONENTS
COMPONENT_UNITS: dict[str, int] = {name: _COMPONENT_UNIT_NAMES[unit] for name, unit, _ in COMPONENTS}
REQUEST_FIELD_UNITS: dict[str, int] = {name: TIME if name.endswith("_us") else COUNT for name in REQUEST_FIELDS}
RETURN_UNITS: dict[str, int] = {name: TIME for name in FUNCTIONS}

# what a rejected operation does, for the message ({0}, {1}: the two units); by symbol, then by rule
_VERBS = {
    "+": "adds {0} and {1}",
    "-": "subtracts {1} from {0}",
    "compare": "compares {0} with {1}",
    "select": "chooses between {0} and {1}",
    "dimensionless": "takes {op} of {0}, which needs a count",
}
_SNIPPET = 70  # characters of the offending expression quoted in a message


def unit_name(k: Fraction | int) -> str:
    """'microseconds', 'a count', 'microseconds^2', 'microseconds^-1', 'microseconds^(1/2)'."""
    if k == COUNT:
        return "a count"
    if k == TIME:
        return "microseconds"
    return f"microseconds^{k}" if k.denominator == 1 else f"microseconds^({k})"


@dataclass(frozen=True)
class Unit:
    """us^power times the units of the unknowns (c.x, or a literal) the program leaves free."""

    power: Fraction
    unknowns: tuple[tuple[str, Fraction], ...] = ()  # (c.<name> or a literal's text, exponent)

    @property
    def exponent(self) -> Fraction | None:
        """The power of microseconds, or None when the unit depends on a free unknown."""
        return None if self.unknowns else self.power

    def __str__(self) -> str:
        if not self.unknowns:
            return unit_name(self.power)
        free = " ".join(f"unit({v})" + (f"^{k}" if k != 1 else "") for v, k in self.unknowns)
        return free if self.power == COUNT else f"{unit_name(self.power)} x {free}"


@dataclass(frozen=True)
class UnitReport:
    """The units of a unit-consistent program (free unknowns where nothing fixes them)."""

    functions: dict[str, Unit]  # what each function returns: a time
    constants: dict[str, Unit]
    locals: dict[str, dict[str, Unit]]  # function -> local name -> unit


def _exact(x: Fraction | int) -> Fraction | int:
    """An int where the fraction is whole: most exponents are, and ints are much faster."""
    return x.numerator if type(x) is Fraction and x.denominator == 1 else x


class _Lin:
    """An exponent: const + sum(coefficient * unknown), exact (ints, or fractions where needed)."""

    __slots__ = ("const", "terms")

    def __init__(self, const: Fraction | int = 0, terms: dict[str, Fraction | int] | None = None):
        self.const, self.terms = const, terms or {}

    def plus(self, other: _Lin, k: Fraction | int = 1) -> _Lin:
        """self + k * other."""
        if not other.terms:
            return _Lin(_exact(self.const + k * other.const), self.terms)
        terms = dict(self.terms)
        for v, c in other.terms.items():
            n = _exact(terms.get(v, 0) + k * c)
            if n:
                terms[v] = n
            else:
                del terms[v]
        return _Lin(_exact(self.const + k * other.const), terms)

    def times(self, k: Fraction | int) -> _Lin:
        k = _exact(k)
        if not k:
            return _Lin()
        return _Lin(_exact(self.const * k), {v: _exact(c * k) for v, c in self.terms.items()})


class _Checker:
    """Walks the program in source order, adding one equation per rule; stops at the first contradiction."""

    def __init__(self, program: Program):
        self.program = program
        self.solved: dict[str, _Lin] = {}  # unknown -> its value in the unknowns still free
        self.lines: dict[str, set[int]] = {}  # unknown -> lines of the equations that fixed it
        self.labels: dict[str, str] = {}  # unknown -> how a message names it
        self.locals: dict[str, dict[str, _Lin]] = {}
        self.returns: dict[str, _Lin] = {}

    # ---- the linear system ----
    def reduce(self, a: _Lin) -> _Lin:
        """a in the unknowns still free."""
        solved = self.solved
        if solved.keys().isdisjoint(a.terms):
            return a
        const, terms = a.const, {}
        for v, c in a.terms.items():
            known = solved.get(v)
            if known is None:
                terms[v] = terms.get(v, 0) + c
                continue
            const += c * known.const
            for w, k in known.terms.items():
                terms[w] = terms.get(w, 0) + c * k
        return _Lin(_exact(const), {v: _exact(k) for v, k in terms.items() if k})

    def equate(self, a: _Lin, b: _Lin, line: int) -> bool:
        """Add the equation a = b; False if it contradicts the earlier ones."""
        raw = a.plus(b, -1)
        d = self.reduce(raw)
        if not d.terms:
            return d.const == 0
        pivot = min(d.terms, key=lambda v: (not v.startswith("#"), v))  # solve for literals first: constants stay named
        c = d.terms[pivot]
        value = d.plus(_Lin(0, {pivot: c}), -1).times(Fraction(-1, c) if type(c) is int else -1 / c)
        why = {line}.union(*(self.lines[v] for v in raw.terms if v in self.lines))
        for v, known in self.solved.items():
            if pivot in known.terms:
                self.solved[v] = known.plus(value, known.terms[pivot]).plus(_Lin(0, {pivot: known.terms[pivot]}), -1)
                self.lines[v] |= why
        self.solved[pivot], self.lines[pivot] = value, why
        return True

    def unit(self, a: _Lin) -> Unit:
        a = self.reduce(a)
        return Unit(Fraction(a.const), tuple((self.labels.get(v, v), Fraction(k)) for v, k in a.terms.items()))

    # ---- messages ----
    def fail(self, node: ast.AST, template: str, units: list[_Lin], about: list[ast.AST], op: str = ""):
        reduced = [self.reduce(u) for u in units]
        names = [unit_name(Fraction(u.const)) for u in reduced]
        what = template.format(*names, op=op)
        shared = Unit(COUNT, tuple((self.labels.get(v, v), Fraction(k)) for v, k in reduced[0].terms.items()))
        if shared.unknowns:  # the sides differ by a power of microseconds only
            what += f", each times {shared}"
        text = ast.unparse(node)
        if len(text) > _SNIPPET:  # keep both ends: the operands that disagree are often the first and the last
            text = text[: _SNIPPET // 2 - 2] + " ... " + text[-(_SNIPPET // 2 - 3) :]
        raise ProgramError(node.lineno, RULE, f"{what} ({text}){self.notes(about)}")

    def notes(self, nodes: list[ast.AST]) -> str:
        """'; c.k is a count (line 3)' for the constants in `nodes` whose unit earlier uses fixed."""
        seen: list[str] = []
        for n in nodes:
            for x in ast.walk(n):
                if (
                    isinstance(x, ast.Attribute)
                    and isinstance(x.value, ast.Name)
                    and x.value.id == "c"
                    and x.attr not in seen
                ):
                    seen.append(x.attr)
        out = []
        for name in seen:
            value = self.solved.get(f"c.{name}")
            if value is not None and not value.terms:
                lines = ", ".join(map(str, sorted(self.lines[f"c.{name}"])))
                out.append(
                    f"c.{name} is {unit_name(Fraction(value.const))} (line{'s' if ',' in lines else ''} {lines})"
                )
        return "".join(f"; {n}" for n in out[:2])

    # ---- the walk ----
    def check(self) -> UnitReport:
        for name, fn in self.program.functions.items():
            scope: dict[str, _Lin] = {}
            self.locals[name] = scope
            for stmt in fn.body:
                if isinstance(stmt, ast.Assign):
                    scope[stmt.targets[0].id] = self.value(stmt.value, scope)
                elif isinstance(stmt, ast.Return):
                    got = self.value(stmt.value, scope)
                    if not self.equate(got, _Lin(RETURN_UNITS[name]), stmt.lineno):
                        self.fail(stmt.value, f"{name} returns {{0}}, which is not a time", [got], [stmt.value])
                    self.returns[name] = got
        constants = {k: self.unit(_Lin(0, {f"c.{k}": 1})) for k in self.program.constants}
        return UnitReport(
            {k: self.unit(v) for k, v in self.returns.items()},
            constants,
            {f: {k: self.unit(v) for k, v in scope.items()} for f, scope in self.locals.items()},
        )

    def value(self, node: ast.AST, scope: dict[str, _Lin]) -> _Lin:
        if isinstance(node, ast.Constant):
            var = f"#{len(self.labels)}"
            self.labels[var] = repr(node.value)
            return _Lin(0, {var: 1})
        if isinstance(node, ast.Attribute):
            base, attr = node.value.id, node.attr
            if base == "c":
                return _Lin(0, {f"c.{attr}": 1})
            return _Lin(COMPONENT_UNITS[attr] if base == "f" else REQUEST_FIELD_UNITS[attr])
        if isinstance(node, ast.Name):
            return scope[node.id]
        op = operator_of(node)
        if op is None or op.kind.in_condition:
            raise TypeError(f"not a validated value node: {type(node).__name__}")
        rule = op.units
        if rule == "select":
            self.condition(node.test, scope)
            return self.agree(op, node, [node.body, node.orelse], scope)
        if rule == "power":
            return self.value(node.left, scope).times(Fraction(repr(literal_number(node.right))))
        if rule == "same":
            return self.agree(op, node, operands(node), scope)
        (a, *rest) = [self.value(x, scope) for x in operands(node)]
        if rule == "keep":
            return a
        if rule == "product":
            return a.plus(rest[0])
        if rule == "quotient":
            return a.plus(rest[0], -1)
        if rule == "half":
            return a.times(Fraction(1, 2))
        if rule == "dimensionless":
            if not self.equate(a, _Lin(COUNT), node.lineno):
                self.fail(node, _VERBS[rule], [a], operands(node), op=op.symbol)
            return _Lin(COUNT)
        raise AssertionError(f"no unit rule {rule!r} for values (operator {op.symbol})")

    def agree(self, op: Operator, node: ast.AST, items: list[ast.AST], scope: dict[str, _Lin]) -> _Lin:
        """Operands that must have one unit (folding left, as the operator does); returns it."""
        verb = _VERBS.get(op.symbol) or _VERBS.get(op.units) or f"takes the {op.symbol} of {{0}} and {{1}}"
        acc = self.value(items[0], scope)
        for item in items[1:]:
            u = self.value(item, scope)
            if not self.equate(acc, u, node.lineno):
                self.fail(node, verb, [acc, u], items)
            acc = self.reduce(acc)
        return acc

    def condition(self, node: ast.AST, scope: dict[str, _Lin]) -> None:
        if isinstance(node, ast.Compare):
            values = operands(node)
            units = [self.value(x, scope) for x in values]
            for i, cmp in enumerate(node.ops):
                op = operator_of(cmp)
                if op.units != "compare":
                    raise AssertionError(f"no unit rule {op.units!r} for comparisons (operator {op.symbol})")
                if not self.equate(units[i], units[i + 1], node.lineno):
                    self.fail(node, _VERBS["compare"], [units[i], units[i + 1]], values)
            return
        op = operator_of(node)
        if op is None or op.units != "condition":
            raise TypeError(f"not a validated condition node: {type(node).__name__}")
        for x in operands(node):
            self.condition(x, scope)


def infer_units(program: Program) -> UnitReport:
    """The unit of every function's result, constant and local; raises ProgramError (rule
    "units") at the first operation whose operands' units contradict (see the module docstring)."""
    return _Checker(program).check()


def check_units(program: Program) -> None:
    """Raises ProgramError(line, "units", message) if the program is not unit-consistent."""
    _Checker(program).check()
