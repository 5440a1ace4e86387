"""Go spelling shared by the Go emitters (the program in source.py, the components in components.py):
identifiers, float literals, operator precedences and parentheses, and the emitters' error."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from stepml_evolve.evaluator.dsl.operators import GO_ATOM, GO_UNARY, OPERATORS, Kind
from stepml_evolve.evaluator.errors import UserError

# + - *: Go spells them like Python (operator -> (Go operator, precedence))
BINARY = {op.node: (op.symbol, op.go_prec) for op in OPERATORS if op.kind is Kind.BINARY and op.go_prec is not None}
ATOM, UNARY = GO_ATOM, GO_UNARY


def wrap(text: str, needed: bool) -> str:
    return f"({text})" if needed else text


class EmitError(UserError, ValueError):
    """The emitter cannot express a construct in Go: names it (and its line)."""


def camel(name: str, upper: bool = True) -> str:
    parts = [p for p in re.split(r"[_\W]+", name) if p]
    s = "".join(p[:1].upper() + p[1:] for p in parts) or "X"
    if s[0].isdigit():
        s = "N" + s
    return s if upper else s[:1].lower() + s[1:]


def go_float(v: float) -> str:
    text = repr(float(v))
    return text if any(ch in text for ch in ".e") else text + ".0"


def go_value(v: float) -> str:
    """A float64 value as a Go expression; -0.0 needs math.Copysign (Go constants have no -0)."""
    return "math.Copysign(0, -1)" if v == 0 and math.copysign(1.0, v) < 0 else go_float(v)


COMPARISONS = {op.node: op.symbol for op in OPERATORS if op.kind is Kind.COMPARE}


def go_number(v: float) -> str:
    """A float as a short exact Go literal in engineering notation (989.5e12, 900e9)."""
    text = Decimal(repr(float(v))).normalize().to_eng_string().lower().replace("e+", "e")
    if float(text) != v:  # cannot happen for finite floats; guards the formatting
        raise EmitError(f"cannot write {v!r} as an exact Go literal")
    return text
