"""Program DSL: parse a program's text with `ast`, validate it against a whitelist.

The text is never imported or executed. A `Program` holds the validated AST of each
function; the compilers (`vm.py`, `numexpr_compile.py`, the Go emitter) read that AST.
The operators a program may use, and what they compute, are the table in `operators.py`.

Rules (each rejection names the line and the rule broken):
  * top level: an optional docstring, `CONSTANTS = {"name": number, ...}` and the functions
    step_time(f, c) [required], queueing_time(r, c), output_token_time(c), post_decode_time(c);
  * a constant is a number (its starting value) or a bounded constant
    `"name": {"start": 1.5, "min": 1.0, "max": 50.0}`: "start" required, "min" and "max" optional
    (an omitted side is unbounded), all finite numbers with min < max and min <= start <= max.
    The fit keeps the constant inside [min, max]. `Program.constants` maps names to starting
    values whatever the form (so the compilers and the Go emitter see numbers only);
    `Program.bounds` holds (min, max) of the bounded ones, -inf/inf for an open side.
    A constant may also carry a prior, `"prior": centre, "spread": s` (both or neither; see
    `Prior`): the fit minimizes its loss plus the prior's penalty, so a constant the data cannot
    identify stays near a documented value. `render_constants` and `with_constants` write bounds
    and priors back in the dict form, so they survive fitting, the archive and re-parsing;
  * function bodies: optional docstring, local assignments `name = expr`, one final `return expr`;
  * expressions: numbers, f.<component>, c.<constant>, r.<request field>, local names,
    + - * / (division protected: x/0 = 0), unary minus, ** with a literal exponent |p| <= 4,
    max min abs sqrt log exp, and `a if cond else b` where cond compares values
    (< <= > >= == !=, combined with and/or/not).
"""

from __future__ import annotations

import ast
import copy
import io
import math
import re
import tokenize
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from stepml_evolve.evaluator.dsl.operators import Kind, float_or_inf, literal_number, operands, operator_of, symbols
from stepml_evolve.evaluator.dsl.pyparse import parse_python
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES

FUNCTIONS: dict[str, tuple[str, ...]] = {
    "step_time": ("f", "c"),
    "queueing_time": ("r", "c"),
    "output_token_time": ("c",),
    "post_decode_time": ("c",),
}
# What queueing_time(r, c) may read of a request: its prompt and output lengths (counts), and
# last_step_us, the duration of the last step the engine started before the request arrived (0
# before the first step). The engine's pipeline makes a new request wait for steps already under
# way (vLLM schedules one step ahead), which no request field can tell; the step in flight can.
REQUEST_FIELDS = ("input_tokens", "output_tokens", "last_step_us")
MAX_SOURCE_BYTES = 64_000
MAX_CONSTANTS = 32
MAX_LOCALS = 32
MAX_DEPTH = 24
MAX_NODES = 400
MAX_ABS_EXPONENT = 4.0
MAX_LITERAL_CHARS = 64  # a numeric literal's characters: a float's 17 digits and exponent fit many times over
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


PRIOR_WEIGHT = 1.0  # loss points (% APE) per squared standard deviation a constant strays from its prior


@dataclass(frozen=True)
class Prior:
    """A constant's prior: its centre and spread, from a documented source (a public efficiency
    figure, a measured overhead). `relative`: the spread is the standard deviation of ln(value), so
    0.15 means "within about 15 %" (a constant whose centre is positive and whose min is absent or
    >= 0); else it is a standard deviation in the constant's own units. The fit adds
    PRIOR_WEIGHT * z**2 to its loss, z the distance from the centre in spreads."""

    centre: float
    spread: float
    relative: bool

    def z(self, value):
        """Distance of value(s) from the centre in spreads (a relative prior: in ln units; a value
        <= 0 is a very long way from a positive centre)."""
        v = np.asarray(value, dtype=float)
        if self.relative:
            return (np.log(np.maximum(v, 1e-300)) - math.log(self.centre)) / self.spread
        return (v - self.centre) / self.spread

    def penalty(self, value):
        return PRIOR_WEIGHT * self.z(value) ** 2

    def text(self) -> str:
        return (
            f"{self.centre:g} x/ {math.exp(self.spread):.3g}"
            if self.relative
            else f"{self.centre:g} +- {self.spread:g}"
        )


def prior_kind(centre: float, lo: float) -> bool:
    """Whether a prior at `centre` on a constant whose min is `lo` (-inf: none) is relative."""
    return centre > 0 and (lo >= 0 or lo == -math.inf)


def prior_penalty(program: Program, population: np.ndarray) -> np.ndarray:
    """The priors' penalty of each constant vector (P, K) in program.constants order -> (P,)."""
    population = np.atleast_2d(np.asarray(population, dtype=float))
    total = np.zeros(len(population))
    for j, name in enumerate(program.constants):
        prior = program.priors.get(name)
        if prior is not None:
            total += prior.penalty(population[:, j])
    return total


class ProgramError(UserError, ValueError):
    """A rejected program: `line`, `rule` and a one-line message (prefixed by the file name)."""

    def __init__(self, line: int | None, rule: str, message: str, origin: str = ""):
        self.line, self.rule, self.message, self.origin = line, rule, message, origin
        where = (f"{origin}: " if origin else "") + (f"line {line}: " if line else "")
        super().__init__(f"{where}{message} [{rule}]")


def expression_size(node: ast.AST) -> int:
    """Nodes of a validated expression: operators, calls, leaves (f.x, c.x, names, numbers).
    A comparison chain counts each comparison, `a and b and c` each `and`."""
    if isinstance(node, (ast.Constant, ast.Attribute, ast.Name)):
        return 1
    if isinstance(node, ast.Compare):
        applied = len(node.ops)
    elif isinstance(node, ast.BoolOp):
        applied = len(node.values) - 1
    elif isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Call, ast.IfExp)):
        applied = 1
    else:
        raise TypeError(f"not a validated expression node: {type(node).__name__}")
    return applied + sum(expression_size(x) for x in operands(node))


@dataclass
class Program:
    """A validated program. `functions` maps a function name to its checked FunctionDef."""

    source: str
    doc: str
    constants: dict[str, float]
    functions: dict[str, ast.FunctionDef]
    constants_span: tuple[int, int] | None = None  # 1-based line span of the CONSTANTS dict
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)  # bounded constants: (min, max), +-inf if open
    priors: dict[str, Prior] = field(default_factory=dict)  # constants with a prior
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def constant_names(self) -> list[str]:
        return list(self.constants)

    def _walk_exprs(self):
        for fn in self.functions.values():
            for stmt in fn.body:
                if isinstance(stmt, (ast.Assign, ast.Return)):
                    yield from ast.walk(stmt.value)

    @property
    def complexity(self) -> int:
        """Expression nodes over all functions; f.x, c.x, r.x and literals count one each."""
        if "complexity" not in self._cache:
            self._cache["complexity"] = sum(
                expression_size(stmt.value)
                for fn in self.functions.values()
                for stmt in fn.body
                if isinstance(stmt, (ast.Assign, ast.Return))
            )
        return self._cache["complexity"]

    @property
    def components_used(self) -> list[str]:
        if "components" not in self._cache:
            used = self.component_uses
            self._cache["components"] = [c for c in COMPONENT_NAMES if c in used]
        return self._cache["components"]

    @property
    def inputs(self) -> frozenset[str]:
        """Every input the program reads: "f.<component>" and "r.<field>" (all functions)."""
        return frozenset(
            f"{n.value.id}.{n.attr}"
            for n in self._walk_exprs()
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("f", "r")
        )

    @property
    def component_uses(self) -> Counter:
        """How many times each component (f.x) appears over all functions."""
        if "uses" not in self._cache:
            self._cache["uses"] = Counter(
                n.attr
                for n in self._walk_exprs()
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "f"
            )
        return self._cache["uses"]

    def with_constants(
        self,
        values: dict[str, float],
        header: str | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
        priors: dict[str, Prior] | None = None,
    ) -> Program:
        """The same program with new constant values (comments and layout kept elsewhere) and the
        same bounds and priors (or, given, these). A value outside its constant's bounds is an error
        (ProgramError, rule "constants"): fits keep inside them, and whoever makes values otherwise
        must clip (`clip`)."""
        unknown = set(values) - set(self.constants)
        if unknown:
            raise KeyError(f"unknown constants {sorted(unknown)}")
        bounds = self.bounds if bounds is None else bounds
        priors = self.priors if priors is None else priors
        consts = {k: float(values.get(k, v)) for k, v in self.constants.items()}
        for k, (lo, hi) in bounds.items():
            if not lo <= consts[k] <= hi:
                raise ProgramError(
                    None,
                    "constants",
                    f"value {consts[k]!r} of constant {k!r} is outside its bounds "
                    f"[{_bound_text(lo)}, {_bound_text(hi)}]",
                )
        lines = self.source.splitlines()
        block = render_constants(consts, bounds, priors)
        if self.constants_span:
            a, b = self.constants_span
            lines = lines[: a - 1] + block.splitlines() + lines[b:]
        else:
            insert_at = _after_docstring(lines, self.source)
            lines = lines[:insert_at] + block.splitlines() + lines[insert_at:]
        lines = [ln for ln in lines if not ln.startswith("# fitted:")] if header else lines
        if header:
            lines = [f"# fitted: {h}" for h in header.splitlines()] + lines
        return parse_program("\n".join(lines) + "\n")

    def clip(self, values: dict[str, float]) -> dict[str, float]:
        """`values` with each bounded constant moved into its bounds (others unchanged)."""
        return {k: clip_to(v, self.bounds.get(k)) for k, v in values.items()}


def clip_to(value: float, bounds: tuple[float, float] | None) -> float:
    """`value` moved into [min, max] (unchanged when `bounds` is None)."""
    value = float(value)
    return value if bounds is None else min(max(value, bounds[0]), bounds[1])


def _bound_text(v: float) -> str:
    return repr(float(v)) if math.isfinite(v) else ("-inf" if v < 0 else "inf")


def render_constants(
    consts: dict[str, float],
    bounds: dict[str, tuple[float, float]] | None = None,
    priors: dict[str, Prior] | None = None,
) -> str:
    """The CONSTANTS block: plain `"name": value` lines, and `"name": {"start": value, "min": ..,
    "max": .., "prior": .., "spread": ..}` for the constants `bounds` bounds (an open side is left
    out) or `priors` gives a prior."""
    if not consts:
        return "CONSTANTS = {}"
    items = []
    for k, v in consts.items():
        lo, hi = (bounds or {}).get(k, (-math.inf, math.inf))
        prior = (priors or {}).get(k)
        if math.isfinite(lo) or math.isfinite(hi) or prior:
            sides = "".join(f', "{side}": {float(b)!r}' for side, b in (("min", lo), ("max", hi)) if math.isfinite(b))
            if prior:
                sides += f', "prior": {float(prior.centre)!r}, "spread": {float(prior.spread)!r}'
            items.append(f'    "{k}": {{"start": {float(v)!r}{sides}}},')
        else:
            items.append(f'    "{k}": {float(v)!r},')
    return "CONSTANTS = {\n" + "\n".join(items) + "\n}"


def _after_docstring(lines: list[str], source: str) -> int:
    tree = parse_python(source)
    if (
        tree.body
        and isinstance(tree.body[0], ast.Expr)
        and isinstance(getattr(tree.body[0], "value", None), ast.Constant)
    ):
        return tree.body[0].end_lineno
    return 0


_BINARY, _CALLS = " ".join(symbols(Kind.BINARY)), symbols(Kind.CALL)  # for rejection messages


def _kind(node: ast.AST) -> Kind | None:
    op = operator_of(node)
    return op.kind if op else None


class _FunctionChecker:
    def __init__(self, fn: ast.FunctionDef, params: tuple[str, ...], constants: dict[str, float]):
        self.fn, self.params, self.constants = fn, params, constants
        self.locals: set[str] = set()
        self.nodes = 0

    def fail(self, node: ast.AST, rule: str, msg: str):
        raise ProgramError(getattr(node, "lineno", self.fn.lineno), rule, msg)

    def check(self) -> None:
        fn = self.fn
        a = fn.args
        names = tuple(x.arg for x in a.args)
        if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or a.kw_defaults or names != self.params:
            self.fail(fn, "signature", f"{fn.name} must be defined as {fn.name}({', '.join(self.params)})")
        if fn.decorator_list or fn.returns or any(x.annotation for x in a.args) or getattr(fn, "type_params", None):
            self.fail(fn, "signature", f"{fn.name} may not have decorators, annotations or type parameters")
        body = list(fn.body)
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body = body[1:]
        if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
            self.fail(fn, "statement", f"{fn.name} must end with one `return <expression>`")
        self.check_size(body)
        for stmt in body[:-1]:
            if not isinstance(stmt, ast.Assign):
                self.fail(
                    stmt, "statement", f"only assignments and one final return are allowed, not {type(stmt).__name__}"
                )
            if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                self.fail(stmt, "statement", "assign to exactly one plain name")
            self.expr(stmt.value, 0)
            name = stmt.targets[0].id
            if not _NAME_RE.match(name) or name in FUNCTIONS or name in _CALLS or name in ("f", "c", "r", "CONSTANTS"):
                self.fail(stmt, "name", f"local name {name!r} is not allowed")
            self.locals.add(name)
            if len(self.locals) > MAX_LOCALS:
                self.fail(stmt, "size", f"more than {MAX_LOCALS} local names")
        self.expr(body[-1].value, 0)

    def check_size(self, body: list[ast.stmt]) -> None:
        """The size rule before the depth rule: Python nests a flat sum left-deep (`a + b + c` is
        `(a + b) + c`), so a sum of 1,000 terms is 999 levels deep, and the recursive walk below
        would call it nested. Counted without recursion, over node kinds the walk counts once
        each (a lower bound of its count, so nothing it would take is refused here)."""
        counted = (ast.BinOp, ast.UnaryOp, ast.Call, ast.Attribute, ast.Compare, ast.BoolOp, ast.IfExp)
        n = sum(isinstance(node, counted) for stmt in body for node in ast.walk(stmt))
        if n > MAX_NODES:
            self.fail(body[-1], "size", f"more than {MAX_NODES} expression nodes in {self.fn.name}")

    def expr(self, node: ast.AST, depth: int) -> None:
        self.nodes += 1
        if depth > MAX_DEPTH:
            self.fail(node, "depth", f"expression nested deeper than {MAX_DEPTH}")
        if self.nodes > MAX_NODES:
            self.fail(node, "size", f"more than {MAX_NODES} expression nodes in {self.fn.name}")
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float) or not math.isfinite(float_or_inf(node.value)):
                self.fail(node, "literal", f"only finite numeric literals are allowed, not {node.value!r}"[:120])
        elif isinstance(node, ast.BinOp):
            op = operator_of(node)
            if op is None:
                self.fail(node, "operator", f"operator {type(node.op).__name__} is not allowed (only {_BINARY})")
            if op.exponent:
                p = literal_number(node.right)
                if p is None:
                    self.fail(node, op.rule, "the exponent of ** must be a numeric literal")
                if abs(p) > MAX_ABS_EXPONENT:
                    self.fail(node, op.rule, f"exponent {p:g} exceeds the limit |p| <= {MAX_ABS_EXPONENT:g}")
                self.expr(node.left, depth + 1)
                return
            self.expr(node.left, depth + 1)
            self.expr(node.right, depth + 1)
        elif isinstance(node, ast.UnaryOp):
            if _kind(node) is not Kind.UNARY:  # `not` belongs to conditions
                self.fail(node, "operator", f"unary {type(node.op).__name__} is only allowed in conditions")
            self.expr(node.operand, depth + 1)
        elif isinstance(node, ast.Call):
            op = operator_of(node)
            if op is None:
                what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)[:40]
                self.fail(node, "call", f"call to {what!r} is not allowed (only {', '.join(_CALLS)})")
            if node.keywords:
                self.fail(node, op.rule, f"{op.symbol}() takes no keyword arguments")
            lo, hi = op.arity
            if not lo <= len(node.args) <= hi or any(isinstance(a, ast.Starred) for a in node.args):
                self.fail(node, op.rule, f"{op.symbol}() takes {lo}" + (f" to {hi}" if hi != lo else "") + " arguments")
            for a in node.args:
                self.expr(a, depth + 1)
        elif isinstance(node, ast.Attribute):
            self.attribute(node)
        elif isinstance(node, ast.Name):
            if node.id not in self.locals:
                self.fail(
                    node,
                    "name",
                    f"name {node.id!r} is not defined (use f.<component>, c.<constant>, r.<field> or an earlier local)",
                )
        elif isinstance(node, ast.IfExp):
            self.condition(node.test, depth + 1)
            self.expr(node.body, depth + 1)
            self.expr(node.orelse, depth + 1)
        else:
            self.fail(node, "expression", f"{type(node).__name__} is not allowed in a program")

    def condition(self, node: ast.AST, depth: int) -> None:
        self.nodes += 1
        if depth > MAX_DEPTH:
            self.fail(node, "depth", f"expression nested deeper than {MAX_DEPTH}")
        if isinstance(node, ast.Compare):
            if any(_kind(cmp) is not Kind.COMPARE for cmp in node.ops):
                self.fail(node, "condition", f"only {' '.join(symbols(Kind.COMPARE))} comparisons are allowed")
            for v in operands(node):
                self.expr(v, depth + 1)
        elif _kind(node) in (Kind.BOOL, Kind.NOT):
            for v in operands(node):
                self.condition(v, depth + 1)
        else:
            self.fail(
                node, "condition", "the test of `a if cond else b` must be a comparison (and/or/not of comparisons)"
            )

    def attribute(self, node: ast.Attribute) -> None:
        base = node.value
        if not isinstance(base, ast.Name) or base.id not in self.params:
            avail = ", ".join(f"{p}.<...>" for p in self.params)
            self.fail(
                node, "attribute", f"attribute access {ast.unparse(node)[:60]!r} not allowed here (available: {avail})"
            )
        if node.attr.startswith("_"):
            self.fail(node, "attribute", f"attribute {node.attr!r} is not allowed")
        if base.id == "f" and node.attr not in COMPONENT_NAMES:
            self.fail(node, "component", f"unknown component f.{node.attr} (known: {', '.join(COMPONENT_NAMES)})")
        if base.id == "c" and node.attr not in self.constants:
            self.fail(node, "constant", f"c.{node.attr} is not in CONSTANTS")
        if base.id == "r" and node.attr not in REQUEST_FIELDS:
            self.fail(
                node, "request-field", f"unknown request field r.{node.attr} (known: {', '.join(REQUEST_FIELDS)})"
            )


BOUND_KEYS = ("start", "min", "max", "prior", "spread")


def _parse_bounded(name: str, node: ast.Dict) -> tuple[float, tuple[float, float], Prior | None]:
    """{"start": s, "min": lo, "max": hi, "prior": p, "spread": w} -> (s, (lo, hi), prior), an
    omitted side +-inf, no prior without "prior" and "spread"."""
    fields: dict[str, float] = {}
    for k, v in zip(node.keys, node.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value in BOUND_KEYS):
            what = repr(k.value)[:40] if isinstance(k, ast.Constant) else "**"
            raise ProgramError(
                getattr(k, "lineno", node.lineno),
                "constants",
                f"constant {name!r}: unknown key {what} (allowed: {', '.join(map(repr, BOUND_KEYS))})",
            )
        if k.value in fields:
            raise ProgramError(k.lineno, "constants", f"constant {name!r}: {k.value!r} given twice")
        val = literal_number(v)
        if val is None or not math.isfinite(val):
            raise ProgramError(v.lineno, "constants", f"constant {name!r}: {k.value!r} must be a finite number")
        fields[k.value] = val
    if "start" not in fields:
        raise ProgramError(node.lineno, "constants", f'constant {name!r}: a bounded constant needs a "start" value')
    start, lo, hi = fields["start"], fields.get("min", -math.inf), fields.get("max", math.inf)
    if not lo < hi:
        raise ProgramError(node.lineno, "constants", f"constant {name!r}: min {lo!r} must be below max {hi!r}")
    if not lo <= start <= hi:
        raise ProgramError(
            node.lineno,
            "constants",
            f"constant {name!r}: start {start!r} is outside [{_bound_text(lo)}, {_bound_text(hi)}]",
        )
    if ("prior" in fields) != ("spread" in fields):
        raise ProgramError(node.lineno, "prior", f'constant {name!r}: a prior needs both "prior" and "spread"')
    if "prior" not in fields:
        return start, (lo, hi), None
    centre, spread = fields["prior"], fields["spread"]
    if not lo <= centre <= hi:
        raise ProgramError(
            node.lineno,
            "prior",
            f"constant {name!r}: prior {centre!r} contradicts its bounds [{_bound_text(lo)}, {_bound_text(hi)}]",
        )
    if not spread > 0:
        raise ProgramError(node.lineno, "prior", f"constant {name!r}: spread {spread!r} must be above 0")
    return start, (lo, hi), Prior(centre, spread, prior_kind(centre, lo))


def _parse_constants(
    node: ast.Assign,
) -> tuple[dict[str, float], dict[str, tuple[float, float]], dict[str, Prior]]:
    """Starting values of all constants, (min, max) of the bounded ones, and the priors."""
    if not isinstance(node.value, ast.Dict):
        raise ProgramError(node.lineno, "constants", "CONSTANTS must be a dict literal")
    out: dict[str, float] = {}
    bounds: dict[str, tuple[float, float]] = {}
    priors: dict[str, Prior] = {}
    for k, v in zip(node.value.keys, node.value.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            raise ProgramError(node.lineno, "constants", "CONSTANTS keys must be string literals")
        if not _NAME_RE.match(k.value):
            raise ProgramError(
                k.lineno,
                "constants",
                f"constant name {k.value[:40]!r} must be an identifier without leading underscore",
            )
        if k.value in out:
            raise ProgramError(k.lineno, "constants", f"constant {k.value!r} defined twice")
        if isinstance(v, ast.Dict):
            val, (lo, hi), prior = _parse_bounded(k.value, v)
            if math.isfinite(lo) or math.isfinite(hi):
                bounds[k.value] = (lo, hi)
            if prior is not None:
                priors[k.value] = prior
        else:
            val = literal_number(v)
            if val is None or not math.isfinite(val):
                raise ProgramError(
                    v.lineno,
                    "constants",
                    f"constant {k.value!r} must be a finite number "
                    'or {"start": number, "min": number, "max": number}',
                )
        out[k.value] = val
    if len(out) > MAX_CONSTANTS:
        raise ProgramError(node.lineno, "constants", f"more than {MAX_CONSTANTS} constants")
    return out, bounds, priors


def _check_literal_lengths(source: str) -> None:
    """Over-long numeric literals are refused by the DSL's own rule before Python's parser sees
    them (whose message for a 5000-digit integer is advice about sys.set_int_max_str_digits)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NUMBER and len(tok.string) > MAX_LITERAL_CHARS:
                raise ProgramError(
                    tok.start[0],
                    "literal",
                    f"a numeric literal of {len(tok.string):,} characters (at most {MAX_LITERAL_CHARS}; "
                    "write a large number with an exponent, e.g. 1.5e30)",
                )
    except (tokenize.TokenError, SyntaxError):
        pass  # malformed text: the parser below names the syntax error


_PUNCTUATION = frozenset("()[]{},:.;=") | {"->"}


def _unparsable(source: str) -> ProgramError:
    """Why Python's parser gave up on `source` (its recursion limit): by the DSL's own rules, read
    off its tokens (no recursion): a statement nested deeper than MAX_DEPTH brackets, or one of
    more than MAX_NODES names, numbers and operators (a flat sum of 6,000 terms, which Python
    nests 6,000 deep: its size is the problem, not nesting anyone wrote)."""
    line, depth, deepest, count = 1, 0, (0, 1), (0, 1)
    n = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                count = max(count, (n, line))
                n, line = 0, tok.end[0] + 1
            elif tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
                deepest = max(deepest, (depth, tok.start[0]))
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
            elif tok.type == tokenize.NUMBER or (tok.type == tokenize.NAME and tok.string not in ("def", "return")):
                n += 1
            elif tok.type == tokenize.OP and tok.string not in _PUNCTUATION:
                n += 1
    except (tokenize.TokenError, SyntaxError):
        count = max(count, (n, line))
    if deepest[0] > MAX_DEPTH:
        return ProgramError(deepest[1], "depth", f"expression nested deeper than {MAX_DEPTH}")
    if count[0] > MAX_NODES:
        return ProgramError(
            count[1],
            "size",
            f"more than {MAX_NODES} expression nodes ({count[0]:,} names, numbers and operators in one statement)",
        )
    return ProgramError(None, "depth", "program text is nested too deeply to parse")


def parse_program(source: str) -> Program:
    """Parse and validate program text; raises ProgramError naming the line and rule."""
    if not isinstance(source, str):
        raise ProgramError(None, "type", "program text must be a string")
    if len(source.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
        raise ProgramError(None, "size", f"program text exceeds {MAX_SOURCE_BYTES} bytes")
    if "\x00" in source:
        raise ProgramError(None, "syntax", "program text contains a NUL byte")
    _check_literal_lengths(source)
    try:
        tree = parse_python(source, quiet=True)  # odd literals in hostile text must not print warnings
    except SyntaxError as e:
        raise ProgramError(e.lineno, "syntax", f"syntax error: {e.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise _unparsable(source) from None
    body = list(tree.body)
    doc = ""
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        doc = body[0].value.value.strip()
        body = body[1:]
    constants: dict[str, float] | None = None
    bounds: dict[str, tuple[float, float]] = {}
    priors: dict[str, Prior] = {}
    span = None
    functions: dict[str, ast.FunctionDef] = {}
    for stmt in body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == "CONSTANTS"
        ):
            if constants is not None:
                raise ProgramError(stmt.lineno, "top-level", "CONSTANTS defined twice")
            constants, bounds, priors = _parse_constants(stmt)
            span = (stmt.lineno, stmt.end_lineno)
        elif isinstance(stmt, ast.FunctionDef):
            if stmt.name not in FUNCTIONS:
                raise ProgramError(
                    stmt.lineno,
                    "top-level",
                    f"function {stmt.name!r} is not part of the DSL (allowed: {', '.join(FUNCTIONS)})",
                )
            if stmt.name in functions:
                raise ProgramError(stmt.lineno, "top-level", f"function {stmt.name!r} defined twice")
            functions[stmt.name] = stmt
        else:
            kind = type(stmt).__name__
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                raise ProgramError(stmt.lineno, "import", "imports are not allowed")
            raise ProgramError(
                stmt.lineno,
                "top-level",
                f"{kind} is not allowed at top level (only a docstring, CONSTANTS and the DSL functions)",
            )
    if "step_time" not in functions:
        raise ProgramError(None, "top-level", "the program must define step_time(f, c)")
    constants = constants or {}
    for name, fn in functions.items():
        _FunctionChecker(fn, FUNCTIONS[name], constants).check()
    return Program(
        source=source,
        doc=doc,
        constants=constants,
        functions=functions,
        constants_span=span,
        bounds=bounds,
        priors=priors,
    )


def read_program_text(path) -> str:
    """A program file's text, read only if it is a regular file within the DSL's MAX_SOURCE_BYTES
    (a device such as /dev/zero, a FIFO or a huge file is refused before reading); ProgramError
    (rule "file", the caller names the file) otherwise. The one way a program file is read."""
    from stepml_evolve.evaluator.readers import FileProblem, file_text

    try:
        return file_text(path, MAX_SOURCE_BYTES)
    except FileProblem as e:
        raise ProgramError(None, "file", f"cannot read program: {e}") from None


def load_program(path) -> Program:
    """Read and parse a program file; ProgramError messages are prefixed with the path."""
    from pathlib import Path

    p = Path(path)
    try:
        return parse_program(read_program_text(p))
    except ProgramError as e:
        raise ProgramError(e.line, e.rule, e.message, origin=str(p)) from None


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
