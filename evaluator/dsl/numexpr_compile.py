"""Vectorized compilation: a validated program becomes a short list of numexpr statements.

Each statement assigns one temporary; operands used twice (by max/min, protected division,
log, if-else) are hoisted into temporaries so nothing is computed twice and expressions
never blow up. Components arrive as arrays named f_<name>, constants as c_<name> (any
broadcastable shape: a column of P constant vectors evaluates a population in one call),
request fields as r_<name>. Semantics match `vm.py` exactly.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

import numexpr as ne
import numpy as np

from .program import Program, literal_number
from .vm import EXP_CLAMP

_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


@dataclass(frozen=True)
class VectorFunction:
    statements: tuple[tuple[str, str], ...]  # (target, numexpr expression)
    result: str  # expression giving the return value
    literals: tuple[tuple[str, float], ...]  # literals are bound names, so numexpr never folds them


class _Builder:
    def __init__(self):
        self.statements: list[tuple[str, str]] = []
        self.literals: list[tuple[str, float]] = []
        self.n = 0

    def literal(self, value: float) -> str:
        name = f"k{len(self.literals)}"
        self.literals.append((name, float(value)))
        return name

    def temp(self, expr: str) -> str:
        if expr.isidentifier():
            return expr
        name = f"t{self.n}"
        self.n += 1
        self.statements.append((name, expr))
        return name

    def expr(self, node: ast.AST) -> str:
        if isinstance(node, ast.Constant):
            return self.literal(node.value)
        if isinstance(node, ast.Attribute):
            return f"{node.value.id}_{node.attr}"
        if isinstance(node, ast.Name):
            return f"l_{node.id}"
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                p = literal_number(node.right)
                base = self.expr(node.left)
                return f"({base})**({p!r})" if float(p).is_integer() else f"abs({base})**({p!r})"
            left, right = self.expr(node.left), self.expr(node.right)
            if isinstance(node.op, ast.Div):
                den = self.temp(right)
                return f"where({den} != 0.0, ({left}) / {den}, 0.0)"
            return f"({left} {_BIN[type(node.op)]} {right})"
        if isinstance(node, ast.UnaryOp):
            inner = self.expr(node.operand)
            return f"(-{inner})" if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.Call):
            name = node.func.id
            args = [self.expr(a) for a in node.args]
            if name == "abs":
                return f"abs({args[0]})"
            if name == "sqrt":
                return f"sqrt(abs({args[0]}))"
            if name == "log":
                x = self.temp(f"abs({args[0]})")
                return f"where({x} > 0.0, log({x}), 0.0)"
            if name == "exp":
                x = self.temp(args[0])
                return f"exp(where({x} < {EXP_CLAMP!r}, {x}, {EXP_CLAMP!r}))"
            acc = self.temp(args[0])
            cmp = ">" if name == "max" else "<"
            for a in args[1:]:
                b = self.temp(a)
                acc = self.temp(f"where({b} {cmp} {acc}, {b}, {acc})")
            return acc
        if isinstance(node, ast.IfExp):
            test = self.temp(self.cond(node.test))
            return f"where({test}, {self.expr(node.body)}, {self.expr(node.orelse)})"
        raise TypeError(f"cannot compile {type(node).__name__}")

    def cond(self, node: ast.AST) -> str:
        if isinstance(node, ast.Compare):
            operands = [self.expr(x) for x in [node.left, *node.comparators]]
            parts = [f"({operands[i]} {_CMP[type(op)]} {operands[i + 1]})" for i, op in enumerate(node.ops)]
            return "(" + " & ".join(parts) + ")"
        if isinstance(node, ast.BoolOp):
            joiner = " & " if isinstance(node.op, ast.And) else " | "
            return "(" + joiner.join(self.cond(v) for v in node.values) + ")"
        return f"(~{self.cond(node.operand)})"


def compile_vector(program: Program, function: str = "step_time") -> VectorFunction:
    fn = program.functions[function]
    b = _Builder()
    result = b.literal(0.0)
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign):
            b.statements.append((f"l_{stmt.targets[0].id}", b.expr(stmt.value)))
        elif isinstance(stmt, ast.Return):
            result = b.expr(stmt.value)
    return VectorFunction(tuple(b.statements), result, tuple(b.literals))


def evaluate_vector(vf: VectorFunction, inputs: dict[str, np.ndarray | float]) -> np.ndarray:
    """Run the statements; inputs maps f_<component>, c_<constant>, r_<field> to arrays."""
    env = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    env.update((k, np.float64(v)) for k, v in vf.literals)
    for target, expr in vf.statements:
        env[target] = ne.evaluate(expr, local_dict=env)
    out = ne.evaluate(vf.result, local_dict=env)
    shapes = [np.shape(v) for v in env.values()]
    return np.broadcast_to(out, np.broadcast_shapes(*shapes, np.shape(out))).astype(np.float64)


def step_times(program: Program, components: np.ndarray, constants: np.ndarray) -> np.ndarray:
    """step_time over component columns (N_COMPONENTS, n_steps) for one constant vector
    (shape (K,)) -> (n_steps,), or for a population (shape (P, K)) -> (P, n_steps)."""
    from ..components import COMPONENT_NAMES

    vf = compile_vector(program, "step_time")
    constants = np.asarray(constants, dtype=np.float64)
    inputs: dict = {f"f_{n}": components[i] for i, n in enumerate(COMPONENT_NAMES)}
    for j, name in enumerate(program.constants):
        inputs[f"c_{name}"] = constants[..., j, None] if constants.ndim == 2 else constants[j]
    return evaluate_vector(vf, inputs)
