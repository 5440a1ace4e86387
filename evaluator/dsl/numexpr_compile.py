"""Vectorized compilation: a validated program becomes a short list of numexpr statements.

The vectorized back end: tests use it as an oracle for the VM (`vm.py`, which the replay
runs), and it is meant for scoring a population of constant vectors over recorded
trajectories in one call. Nothing else calls it today.

Each statement assigns one temporary; operands used twice (by max/min, protected division,
log, if-else) are hoisted into temporaries so nothing is computed twice and expressions
never blow up. Components arrive as arrays named f_<name>, constants as c_<name> (any
broadcastable shape: a column of P constant vectors evaluates a population in one call),
request fields as r_<name>. The forms come from the operator table (`operators.py`), so the
semantics match `vm.py` exactly.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import reduce

import numexpr as ne
import numpy as np

from stepml_evolve.evaluator.dsl.operators import AND, Kind, Operator, literal_number, operands, operator_of
from stepml_evolve.evaluator.dsl.program import Program


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
        op = operator_of(node)
        if op is None or op.kind.in_condition:
            raise TypeError(f"cannot compile {type(node).__name__}")
        if op.exponent:
            return op.numexpr.format(self.expr(node.left), p=repr(literal_number(node.right)))
        if op.kind is Kind.IF_ELSE:
            test = self.temp(self.cond(node.test))
            return op.numexpr.format(test, self.expr(node.body), self.expr(node.orelse))
        args = [self.expr(a) for a in operands(node)]
        if op.kind is Kind.CALL and len(args) > 1:  # max/min: each step uses its operands twice
            acc = self.temp(args[0])
            for a in args[1:]:
                acc = self.temp(op.numexpr.format(acc, self.temp(a)))
            return acc
        hoisted = self.temp(op.hoist.format(*args)) if op.hoist else None
        return op.numexpr.format(*args, h=hoisted)

    def cond(self, node: ast.AST) -> str:
        """A chain of comparisons, or of and/or, is parenthesized as a whole."""
        if isinstance(node, ast.Compare):
            values = [self.expr(x) for x in operands(node)]
            links = [operator_of(cmp).numexpr.format(values[i], values[i + 1]) for i, cmp in enumerate(node.ops)]
            return "(" + _chain(AND, links) + ")"
        op = operator_of(node)
        if op.kind is Kind.BOOL:
            return "(" + _chain(op, [self.cond(v) for v in node.values]) + ")"
        return op.numexpr.format(self.cond(node.operand))


def _chain(op: Operator, items: list[str]) -> str:
    return reduce(lambda acc, item: op.numexpr.format(acc, item), items)


def compile_vector(program: Program, function: str = "step_time") -> VectorFunction:
    return compile_function(program.functions[function])


def compile_function(fn: ast.FunctionDef) -> VectorFunction:
    """One validated function (or a rewrite of one: discovery/sites.py adds a probe to it)."""
    b = _Builder()
    result = b.literal(0.0)
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign):
            b.statements.append((f"l_{stmt.targets[0].id}", b.expr(stmt.value)))
        elif isinstance(stmt, ast.Return):
            result = b.expr(stmt.value)
    return VectorFunction(tuple(b.statements), result, tuple(b.literals))


def compile_expression(expr: ast.expr) -> VectorFunction:
    """One validated expression with no locals (an inlined function, rewritten): a value, or a
    condition, which evaluates to 1.0 where it holds and 0.0 elsewhere."""
    b = _Builder()
    test = isinstance(expr, (ast.Compare, ast.BoolOp)) or (
        isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not)
    )
    result = b.temp(f"where({b.cond(expr)}, 1.0, 0.0)") if test else b.expr(expr)
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
    from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES

    vf = compile_vector(program, "step_time")
    constants = np.asarray(constants, dtype=np.float64)
    inputs: dict = {f"f_{n}": components[i] for i, n in enumerate(COMPONENT_NAMES)}
    for j, name in enumerate(program.constants):
        inputs[f"c_{name}"] = constants[..., j, None] if constants.ndim == 2 else constants[j]
    return evaluate_vector(vf, inputs)
