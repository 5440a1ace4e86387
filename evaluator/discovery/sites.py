"""Where in step_time a candidate term goes: added to its result (the default), or inside one side
of a roofline, an argument of a `max` whose arguments each read a time component.

A GEMM tile's padding is compute: in a roofline it lengthens the compute side, and costs nothing
where the weights' streaming hides the compute. Added outside the max it costs every step, and a
fit that soaks up the padding there predicts memory-bound steps slow on a GPU whose balance of
compute and bandwidth differs (by-gpu, tile_quantization: 7.9 held out against 4.5 for the seed;
inside the compute side, 4.3, and it fits the train configurations twice as well: docs/concepts/discovery.md).

On the frozen schedule, a term added inside a site moves each step by its value times the step
time's derivative with respect to that site (1 where that side binds, 0 where another does, and
any factor the max is multiplied by): `Site.weights` gives it, as a forward difference of the step
times with a probe constant added to the site, once per site and set of steps. The closed loop
still judges every child: a term that makes its side bind on more steps moves them further.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

import numpy as np

from stepml_evolve.evaluator.dsl import Program
from stepml_evolve.evaluator.dsl.numexpr_compile import compile_function, evaluate_vector
from stepml_evolve.evaluator.dsl.program import inlined
from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES, TIME_COMPONENTS
from stepml_evolve.evaluator.physics.rules import summed_times

PROBE = "probe__"  # the constant added at a site to measure its derivative (no program's constant is named so)
PROBE_US = 1.0  # its value: a microsecond (every step's derivative at a site is 0 or a factor, piecewise)


@dataclass(frozen=True)
class Site:
    """One argument of one `max` of step_time: the statement that holds the max, the max's rank among
    the statement's max calls (ast.walk order), the argument's position, and its text."""

    statement: int
    call: int
    argument: int
    shown: str
    summed: frozenset[str]  # the time components the argument adds as themselves (after inlining)

    def placed(self, fn: ast.FunctionDef, term: ast.expr) -> None:
        """Add `term` to this site's argument of `fn` (a copy of the function the site was found in)."""
        call = _max_calls(fn.body[self.statement].value)[self.call]
        call.args[self.argument] = ast.BinOp(left=call.args[self.argument], op=ast.Add(), right=term)

    def weights(self, program: Program, constants: dict[str, float], components: np.ndarray) -> np.ndarray:
        """Each step's derivative of step_time with respect to a time added at this site."""
        fn = copy.deepcopy(program.functions["step_time"])
        self.placed(fn, ast.Attribute(value=ast.Name(id="c", ctx=ast.Load()), attr=PROBE, ctx=ast.Load()))
        vf = compile_function(ast.fix_missing_locations(fn))
        inputs: dict = {f"f_{n}": components[i] for i, n in enumerate(COMPONENT_NAMES)}
        inputs.update((f"c_{k}", constants[k]) for k in program.constants)
        at = evaluate_vector(vf, {**inputs, f"c_{PROBE}": 0.0})
        moved = evaluate_vector(vf, {**inputs, f"c_{PROBE}": PROBE_US})
        return (moved - at) / PROBE_US


def _max_calls(expr: ast.AST) -> list[ast.Call]:
    return [
        n for n in ast.walk(expr) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "max"
    ]


def _reads_time(expr: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "f"
        and n.attr in TIME_COMPONENTS
        for n in ast.walk(expr)
    )


def sites_of(program: Program) -> list[Site]:
    """The arguments of step_time's rooflines: every `max` (in an assignment or the return) with two
    arguments or more, each of which reads a time component once its locals are substituted."""
    fn = program.functions["step_time"]
    scope: dict[str, ast.expr] = {}
    out = []
    for i, stmt in enumerate(fn.body):
        if not isinstance(stmt, (ast.Assign, ast.Return)):
            continue
        for j, call in enumerate(_max_calls(stmt.value)):
            args = [_substituted(a, scope) for a in call.args]
            if len(args) >= 2 and all(_reads_time(a) for a in args):
                named = f" (in {stmt.targets[0].id})" if isinstance(stmt, ast.Assign) else ""
                for k, a in enumerate(args):
                    out.append(Site(i, j, k, ast.unparse(call.args[k]) + named, frozenset(summed_times(a))))
        if isinstance(stmt, ast.Assign):
            scope[stmt.targets[0].id] = _substituted(stmt.value, scope)
    return out


def _substituted(expr: ast.expr, scope: dict[str, ast.expr]) -> ast.expr:
    """`expr` with the locals assigned before it substituted (as `inlined` does for a return)."""
    fn = ast.FunctionDef(
        name="_",
        args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[ast.Assign(targets=[ast.Name(id=k, ctx=ast.Store())], value=v) for k, v in scope.items()]
        + [ast.Return(value=copy.deepcopy(expr))],
        decorator_list=[],
    )
    return inlined(fn)
