"""The DSL's operators: one table that the validator and every back end read.

Each row of OPERATORS is one operation with one meaning: how the DSL spells it, the AST node
that holds it, its operands, the value every back end computes (`semantics`: protected where
plain math would fail), and how each back end writes it: the VM opcode, the numexpr form, the
Go form and the GP primitive. The back ends keep only what is structural (how a node's operands
are visited, how a variadic call or a comparison chain folds); the facts are here.
  validator        program.py       which operators exist where, call arities, the exponent rule
  VM               vm.py            opcodes (numba's `run_code` has one branch per opcode)
  numexpr          numexpr_compile  forms and hoisted temporaries
  Go               evolve/go_source   forms, precedences and the model's helper functions
  GP (DEAP)        evolve/symbolic  primitive names, and their order in the primitive set
  units            units.py         each operator's unit rule (`units`: a name in UNIT_RULES)

Adding an operator of an existing kind, e.g. a function tanh(x), takes:
  1. one row here, among the calls (the GP primitive set adds primitives in table order, so
     a row's position changes which children DEAP draws, not what any program computes):
       Operator("tanh", Kind.CALL, "tanh", (1, 1), "call", "tanh(x)", opcode=30, vm="TANH",
                numexpr="tanh({0})", go="math.Tanh({0})", gp="tanh", units="dimensionless"),
  2. one branch in `vm.run_code`:
       elif op == Opcode.TANH:
           stack[sp - 1] = np.tanh(stack[sp - 1])
An operator that compiles to existing instructions (no new opcode) needs only the row. A new
opcode takes the next unused number, and no opcode is ever renumbered: numba's on-disk cache of
`run_code` freezes the numbers and only notices edits to vm.py. A Go form may name only helpers
the template defines (go_source.HELPERS). A new kind of node (another AST construct) needs code in
each back end.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from enum import Enum

EXP_CLAMP = 80.0  # exp(x) is exp(min(x, EXP_CLAMP)): finite for every finite x

# Go operator precedences: the spec's binary levels x 10, unary operators above, operands on top
GO_ADD, GO_MUL, GO_UNARY, GO_ATOM = 40, 50, 90, 100


# How an operator's operands and result carry units (powers of microseconds; see units.py).
UNIT_RULES = {
    "same": "the operands have one unit, which is the result's (a + b, max(a, b))",
    "keep": "the result has the operand's unit (-a, abs(a))",
    "product": "exponents add (a * b)",
    "quotient": "exponents subtract (a / b)",
    "power": "the exponent is multiplied by the literal p (a ** p)",
    "half": "the exponent is halved (sqrt(a))",
    "dimensionless": "the operand must be a count, and so is the result (log(a), exp(a))",
    "compare": "the operands have one unit; the result is a condition",
    "condition": "the operands are conditions, and so is the result (and, or, not)",
    "select": "both branches have one unit, which is the result's (a if cond else b)",
}

# How an operator's result stays affine in the constants its operands are affine in (linearity.py:
# the constants a fit may solve by least squares). A new operator is "nonlinear" unless its row says so.
LINEARITY_RULES = {
    "sum": "affine in what either operand is affine in (a + b, a - b)",
    "keep": "affine in what the operand is affine in (-a, +a)",
    "product": "affine when at most one operand depends on those constants (a * b)",
    "quotient": "affine in the numerator's constants when the denominator depends on none (a / b)",
    "power": "a ** 1 is a, a ** 0 is 1; other exponents are not affine",
    "select": "affine in what both branches are affine in, when the condition depends on none",
    "condition": "a constant in a condition decides a branch: never affine",
    "nonlinear": "no constant its operands depend on is affine in the result (max, abs, log, ...)",
}


class Kind(Enum):
    """The AST construct holding an operator: it fixes the operands and where the node may be."""

    BINARY = "a op b (BinOp)"
    UNARY = "op a, in a value (UnaryOp)"
    CALL = "name(a, ...) (Call); more than one argument folds left: max(a, b, c) = max(max(a, b), c)"
    COMPARE = "a op b, one operator of a chain (Compare): a < b < c is a < b and b < c"
    BOOL = "a op b op ..., folding left (BoolOp)"
    NOT = "not a (UnaryOp in a condition)"
    IF_ELSE = "a if cond else b (IfExp)"

    @property
    def in_condition(self) -> bool:
        """Conditions (the test of an if-else) hold these; values hold the others."""
        return self in (Kind.COMPARE, Kind.BOOL, Kind.NOT)


@dataclass(frozen=True)
class Operator:
    symbol: str  # DSL spelling ("-" is both a BINARY and a UNARY row)
    kind: Kind
    node: type[ast.AST] | str  # the AST operator class (ast.Add, ast.Lt, ast.IfExp, ...), or a call's name
    arity: tuple[int, int | None]  # fewest and most operands (None: no limit)
    rule: str  # the validator rule that rejects a misuse of its operands
    semantics: str
    opcode: int | None  # VM instruction; None: compiles to no instruction
    vm: str | None  # the instruction's name in vm.Opcode
    numexpr: str  # {0} {1} ...: operands; {h}: the `hoist` temporary; {p}: the exponent
    go: str  # {0} {1} ...: operands; {p}: the exponent; {Div} {Max} ...: the model's helper functions
    go_prec: int | None = None  # precedence of the Go operator in `go`; None: a call form (operands are arguments)
    gp: str | None = None  # DEAP primitive name; None: GP trees cannot hold it
    hoist: str | None = None  # numexpr: evaluated once into a temporary (the form uses it twice)
    exponent: str | None = None  # "**" rows: "integer" or "other" exponents (a literal, not an operand)
    units: str = ""  # the unit rule (a key of UNIT_RULES)
    linearity: str = "nonlinear"  # how its result depends on constants it is affine in (a key of LINEARITY_RULES)

    @property
    def identity(self) -> bool:
        """Unary plus: every back end writes its operand unchanged."""
        return self.node is ast.UAdd


def _compare(symbol: str, node: type[ast.AST], opcode: int, vm: str, gp: str | None = None) -> Operator:
    return Operator(
        symbol,
        Kind.COMPARE,
        node,
        (2, 2),
        "condition",
        f"1 if a {symbol} b else 0",
        opcode=opcode,
        vm=vm,
        numexpr=f"({{0}} {symbol} {{1}})",
        go=f"{{0}} {symbol} {{1}}",
        gp=gp,
        units="compare",
        linearity="condition",
    )


OPERATORS: tuple[Operator, ...] = (
    Operator(
        "+",
        Kind.BINARY,
        ast.Add,
        (2, 2),
        "operator",
        "a + b",
        opcode=6,
        vm="ADD",
        numexpr="({0} + {1})",
        go="{0} + {1}",
        go_prec=GO_ADD,
        gp="add",
        units="same",
        linearity="sum",
    ),
    Operator(
        "-",
        Kind.BINARY,
        ast.Sub,
        (2, 2),
        "operator",
        "a - b",
        opcode=7,
        vm="SUB",
        numexpr="({0} - {1})",
        go="{0} - {1}",
        go_prec=GO_ADD,
        gp="sub",
        units="same",
        linearity="sum",
    ),
    # float64(...) rounds the product: Go may not fuse it with an addition into an FMA (arm64)
    Operator(
        "*",
        Kind.BINARY,
        ast.Mult,
        (2, 2),
        "operator",
        "a * b",
        opcode=8,
        vm="MUL",
        numexpr="({0} * {1})",
        go="float64({0} * {1})",
        go_prec=GO_MUL,
        gp="mul",
        units="product",
        linearity="product",
    ),
    Operator(
        "/",
        Kind.BINARY,
        ast.Div,
        (2, 2),
        "operator",
        "a / b, and 0 where b == 0",
        opcode=9,
        vm="DIV",
        numexpr="where({h} != 0.0, ({0}) / {h}, 0.0)",
        hoist="{1}",
        go="{Div}({0}, {1})",
        gp="div",
        units="quotient",
        linearity="quotient",
    ),
    Operator(
        "-",
        Kind.UNARY,
        ast.USub,
        (1, 1),
        "operator",
        "-a",
        opcode=10,
        vm="NEG",
        numexpr="(-{0})",
        go="-{0}",
        go_prec=GO_UNARY,
        gp="neg",
        units="keep",
        linearity="keep",
    ),
    Operator(
        "+",
        Kind.UNARY,
        ast.UAdd,
        (1, 1),
        "operator",
        "a",
        opcode=None,
        vm=None,
        numexpr="{0}",
        go="{0}",
        go_prec=GO_UNARY,
        units="keep",
        linearity="keep",
    ),
    Operator(
        "max",
        Kind.CALL,
        "max",
        (2, 8),
        "call",
        "the largest: b if b > a else a, folded left",
        opcode=13,
        vm="MAX",
        numexpr="where({1} > {0}, {1}, {0})",
        go="{Max}({0}, {1})",
        gp="max2",
        units="same",
    ),
    Operator(
        "min",
        Kind.CALL,
        "min",
        (2, 8),
        "call",
        "the smallest: b if b < a else a, folded left",
        opcode=14,
        vm="MIN",
        numexpr="where({1} < {0}, {1}, {0})",
        go="{Min}({0}, {1})",
        gp="min2",
        units="same",
    ),
    Operator(
        "abs",
        Kind.CALL,
        "abs",
        (1, 1),
        "call",
        "|x|",
        opcode=15,
        vm="ABS",
        numexpr="abs({0})",
        go="math.Abs({0})",
        gp="abs",
        units="keep",
    ),
    Operator(
        "sqrt",
        Kind.CALL,
        "sqrt",
        (1, 1),
        "call",
        "sqrt(|x|)",
        opcode=16,
        vm="SQRT",
        numexpr="sqrt(abs({0}))",
        go="math.Sqrt(math.Abs({0}))",
        gp="sqrt",
        units="half",
    ),
    Operator(
        "log",
        Kind.CALL,
        "log",
        (1, 1),
        "call",
        "log(|x|), and 0 at x == 0",
        opcode=17,
        vm="LOG",
        numexpr="where({h} > 0.0, log({h}), 0.0)",
        hoist="abs({0})",
        go="{Log}({0})",
        gp="log",
        units="dimensionless",
    ),
    Operator(
        "exp",
        Kind.CALL,
        "exp",
        (1, 1),
        "call",
        f"exp(min(x, {EXP_CLAMP:g}))",
        opcode=18,
        vm="EXP",
        numexpr=f"exp(where({{h}} < {EXP_CLAMP!r}, {{h}}, {EXP_CLAMP!r}))",
        hoist="{0}",
        go="{Exp}({0})",
        gp="exp",
        units="dimensionless",
    ),
    # ** after the calls: GP adds its powers (pow2, pow0_5, ...) after neg, abs, sqrt, log, exp
    Operator(
        "**",
        Kind.BINARY,
        ast.Pow,
        (2, 2),
        "exponent",
        "x ** p for a literal integer p, |p| <= 4",
        opcode=11,
        vm="POWI",
        numexpr="({0})**({p})",
        go="math.Pow({0}, {p})",
        gp="pow",
        exponent="integer",
        units="power",
        linearity="power",
    ),
    Operator(
        "**",
        Kind.BINARY,
        ast.Pow,
        (2, 2),
        "exponent",
        "|x| ** p for a literal non-integer p, |p| <= 4",
        opcode=12,
        vm="POWF",
        numexpr="abs({0})**({p})",
        go="math.Pow(math.Abs({0}), {p})",
        gp="pow",
        exponent="other",
        units="power",
    ),
    _compare("<", ast.Lt, 19, "LT"),
    _compare("<=", ast.LtE, 20, "LE"),
    _compare(">", ast.Gt, 21, "GT", gp="ifgt"),  # GP: ifgt(a, b, then, else)
    _compare(">=", ast.GtE, 22, "GE", gp="ifge"),
    _compare("==", ast.Eq, 23, "EQ"),
    _compare("!=", ast.NotEq, 24, "NE"),
    # Go: helpers, not && and ||: go vet rejects `x != 1 || x != 2` and repeated operands, which
    # are valid (if odd) programs; the operands have no side effects
    Operator(
        "and",
        Kind.BOOL,
        ast.And,
        (2, None),
        "condition",
        "1 if a != 0 and b != 0 else 0",
        opcode=25,
        vm="AND",
        numexpr="{0} & {1}",
        go="{And}({0}, {1})",
        units="condition",
        linearity="condition",
    ),
    Operator(
        "or",
        Kind.BOOL,
        ast.Or,
        (2, None),
        "condition",
        "1 if a != 0 or b != 0 else 0",
        opcode=26,
        vm="OR",
        numexpr="{0} | {1}",
        go="{Or}({0}, {1})",
        units="condition",
        linearity="condition",
    ),
    Operator(
        "not",
        Kind.NOT,
        ast.Not,
        (1, 1),
        "condition",
        "1 if a == 0 else 0",
        opcode=27,
        vm="NOT",
        numexpr="(~{0})",
        go="!({0})",
        units="condition",
        linearity="condition",
    ),
    Operator(
        "if-else",
        Kind.IF_ELSE,
        ast.IfExp,
        (3, 3),
        "condition",
        "a if cond != 0 else b (both evaluated)",
        opcode=28,
        vm="SELECT",
        numexpr="where({0}, {1}, {2})",
        go="{Select}({0}, {1}, {2})",
        units="select",
        linearity="select",
    ),
)

_BY_NODE = {op.node: op for op in OPERATORS if not op.exponent}  # AST operator class or call name -> row
_POWER = {op.exponent: op for op in OPERATORS if op.exponent}
AND = _BY_NODE[ast.And]  # joins the links of a comparison chain


def operator_of(node: ast.AST) -> Operator | None:
    """The row of an expression node (BinOp, UnaryOp, Call, BoolOp, IfExp) or of one operator
    of a Compare (an item of `node.ops`); None when the DSL has no such operator."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        p = literal_number(node.right)
        return _POWER["integer" if p is not None and float(p).is_integer() else "other"]
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp)):
        return _BY_NODE.get(type(node.op))
    if isinstance(node, ast.Call):
        return _BY_NODE.get(node.func.id) if isinstance(node.func, ast.Name) else None
    return _BY_NODE.get(type(node))


def operands(node: ast.AST) -> list[ast.AST]:
    """The operand subtrees of an operator node, in source order."""
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if isinstance(node, ast.Call):
        return list(node.args)
    if isinstance(node, ast.Compare):
        return [node.left, *node.comparators]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.IfExp):
        return [node.test, node.body, node.orelse]
    return []


def symbols(kind: Kind) -> list[str]:
    """The DSL spellings of one kind's operators, in table order (for messages)."""
    return list(dict.fromkeys(op.symbol for op in OPERATORS if op.kind is kind))


def literal_number(node: ast.AST) -> float | None:
    """The value of a numeric literal or a negated one; None for anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = literal_number(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float_or_inf(node.value)
    return None


def float_or_inf(value: int | float) -> float:
    """float(value), with integers too large for a float as inf (rejected as non-finite)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _check_table() -> None:
    opcodes = [op.opcode for op in OPERATORS if op.opcode is not None]
    names = [op.vm for op in OPERATORS if op.vm is not None]
    if len(set(opcodes)) != len(opcodes) or len(set(names)) != len(names) or len(names) != len(opcodes):
        raise AssertionError("every VM opcode of the operator table needs its own number and name")
    unruled = [op.symbol for op in OPERATORS if op.units not in UNIT_RULES]
    if unruled:
        raise AssertionError(f"operators without a unit rule (a key of UNIT_RULES): {unruled}")
    unruled = [op.symbol for op in OPERATORS if op.linearity not in LINEARITY_RULES]
    if unruled:
        raise AssertionError(f"operators without a linearity rule (a key of LINEARITY_RULES): {unruled}")


_check_table()
