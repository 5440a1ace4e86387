"""The constants a program is affine in: those a fit may solve by least squares.

A replay's latency means, on a fixed schedule, are sums of step times and per-request delays
(evaluator/scoring/surrogate.py). If every function of a program is affine in a set L of its constants (jointly:
no product of two of them, none inside max, abs, log, a condition, ...), the surrogate's means
are affine in L for any fixed value of the others, and the trust region's surrogate step finds
L's best values with one bounded least-squares solve instead of sampling them (variable
projection, fitting.py). A constant is in L only when the operator table says every operation
on its way to a function's result keeps it affine (operators.LINEARITY_RULES, one rule per row);
an operator without a rule there is "nonlinear", so a new operator is never taken for affine.

Where two affine parts multiply (c.a * (c.b * f.gemm + ...)), one side must leave L: the one
with fewer constants (the right one on a tie), which keeps the most constants solvable; the
analysis then starts over without it, until no rule is broken. r.last_step_us (the step in
flight at a request's arrival) carries the constants step_time is affine in.
"""

from __future__ import annotations

import ast

from stepml_evolve.evaluator.dsl.operators import literal_number, operands, operator_of
from stepml_evolve.evaluator.dsl.program import Program

# the order the functions are read in: queueing_time reads step_time's result (r.last_step_us)
_ORDER = ("step_time", "queueing_time", "output_token_time", "post_decode_time")


class _Leave(Exception):
    """These constants are not affine where the walk met them: the analysis restarts without them."""

    def __init__(self, names: frozenset[str]):
        self.names = names


class _Walk:
    """`root`: the names the analysis is about, c.<constant> (a fit's unknowns) or f.<component>
    (a step's data, for fixed constants); everything else is data."""

    def __init__(self, program: Program, candidates: set[str], root: str = "c", functions: tuple[str, ...] = _ORDER):
        self.program, self.candidates, self.root, self.functions = program, candidates, root, functions
        self.step_time: frozenset[str] = frozenset()
        self.read: set[str] = set()  # the names of `root` the functions read

    def run(self) -> None:
        for name in self.functions:
            fn = self.program.functions.get(name)
            if fn is None:
                continue
            scope: dict[str, frozenset[str]] = {}
            for stmt in fn.body:
                if isinstance(stmt, ast.Assign):
                    scope[stmt.targets[0].id] = self.value(stmt.value, scope)
                elif isinstance(stmt, ast.Return):
                    result = self.value(stmt.value, scope)
                    if name == "step_time":
                        self.step_time = result

    def value(self, node: ast.AST, scope: dict[str, frozenset[str]]) -> frozenset[str]:
        """The candidate constants `node` is affine in (it depends on no other candidate)."""
        if isinstance(node, ast.Constant):
            return frozenset()
        if isinstance(node, ast.Attribute):
            if node.value.id == self.root:
                self.read.add(node.attr)
                return frozenset({node.attr}) & self.candidates
            if node.value.id == "r" and node.attr == "last_step_us":
                return self.step_time
            return frozenset()  # f.<component>, r.<request field>: data
        if isinstance(node, ast.Name):
            return scope[node.id]
        op = operator_of(node)
        if op is None:
            raise TypeError(f"not a validated value node: {type(node).__name__}")
        rule = op.linearity
        if rule == "select":
            self.fixed(node.test, scope)
            return self.value(node.body, scope) | self.value(node.orelse, scope)
        if rule == "power":
            p = literal_number(node.right)
            base = self.value(node.left, scope)
            if p == 1:
                return base
            return self.leave(base) if p != 0 else frozenset()
        parts = [self.value(x, scope) for x in operands(node)]
        if rule in ("sum", "keep"):
            return frozenset().union(*parts)
        if rule == "product":
            a, b = parts
            if a and b:
                self.leave(b if len(b) <= len(a) else a)
            return a | b
        if rule == "quotient":
            self.leave(parts[1])
            return parts[0]
        return self.leave(frozenset().union(*parts))  # "nonlinear" (and any rule not above)

    def fixed(self, node: ast.AST, scope: dict[str, frozenset[str]]) -> None:
        """A condition (a comparison, or and/or/not of conditions): the constants it reads leave."""
        for x in operands(node):
            if isinstance(node, ast.Compare):
                self.leave(self.value(x, scope))
            else:
                self.fixed(x, scope)

    def leave(self, names: frozenset[str]) -> frozenset[str]:
        if names:
            raise _Leave(names)
        return frozenset()


def _affine(program: Program, names: set[str], root: str, functions: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(the names of `root` the functions read, those of them the functions are jointly affine in)."""
    while True:
        walk = _Walk(program, names, root, functions)
        try:
            walk.run()
            return walk.read, names & walk.read
        except _Leave as e:
            names = names - e.names


def linear_constants(program: Program) -> tuple[str, ...]:
    """The constants (in the program's order) that its functions read and are jointly affine in."""
    if "linear" not in program._cache:
        _, affine = _affine(program, set(program.constants), "c", _ORDER)
        program._cache["linear"] = tuple(k for k in program.constants if k in affine)
    return program._cache["linear"]


def nonaffine_inputs(program: Program, function: str, root: str, names: list[str]) -> tuple[str, ...]:
    """The data names of `root` (f: components, r: request fields) that `function` reads and is
    not jointly affine in for fixed constants, in the order given. Inputs it reads only affinely
    can be averaged over many steps or requests without changing the summed result (the
    surrogate's classes rely on it)."""
    if function not in program.functions:
        return ()
    read, affine = _affine(program, set(names), root, (function,))
    return tuple(k for k in names if k in read and k not in affine)


def read_inputs(program: Program, function: str, root: str, names: list[str]) -> tuple[str, ...]:
    """The data names of `root` that `function` reads, in the order given."""
    if function not in program.functions:
        return ()
    read, _ = _affine(program, set(names), root, (function,))
    return tuple(k for k in names if k in read)
