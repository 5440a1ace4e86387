"""Symbolic mutation operators on a program's step_time, with DEAP's GP tools.

A program's step_time (locals inlined) becomes a DEAP PrimitiveTree; DEAP mutates or crosses
trees; the result is rendered back to DSL text and goes through the same validator as LLM
output. DEAP never compiles or evaluates anything here: its primitives are names only.
New ephemeral constants become named constants (k1, k2, ...) that the fit then tunes.
Randomness comes from the `random` module, which the caller seeds per child.
"""
from __future__ import annotations

import ast
import math
import random

from deap import gp

from evaluator.components import COMPONENT_NAMES
from evaluator.dsl import REQUEST_FIELDS, Program
from evaluator.dsl.program import literal_number, render_constants

MAX_TREE_HEIGHT = 12
# exponent -> primitive name; other exponents are not representable for GP (the LLM may use them)
POWERS = {2.0: "pow2", 3.0: "pow3", 0.5: "pow0_5", 1.5: "pow1_5", -1.0: "powm1", -0.5: "powm0_5", -2.0: "powm2"}
BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
UNARY_CALLS = ("abs", "sqrt", "log", "exp")
OPERATORS = ("subtree", "node_replace", "insert", "shrink", "crossover", "constants", "add_term")
TIME_COMPONENTS = {"gemm_pf", "gemm_dc", "attn_pf", "attn_dc", "weights", "kv_read", "kv_write", "allreduce"}
MUTABLE_FUNCTIONS = {"step_time": 0.8, "queueing_time": 0.2}  # which function a structural operator edits


class NotRepresentable(ValueError):
    """The program uses a construct the GP tree cannot express (e.g. `and` in a condition)."""


def _noop(*args):  # primitives are never called: trees are rendered to text, not compiled
    return 0.0


def _new_constant_value() -> float:
    return round(10 ** random.uniform(-1.0, 3.0), 4)


def primitive_set(constant_names: list[str], function: str = "step_time") -> gp.PrimitiveSet:
    pset = gp.PrimitiveSet(function, 0)
    for name in ("add", "sub", "mul", "div", "max2", "min2"):
        pset.addPrimitive(_noop, 2, name=name)
    for name in ("neg", *UNARY_CALLS, *POWERS.values()):
        pset.addPrimitive(_noop, 1, name=name)
    pset.addPrimitive(_noop, 4, name="ifgt")
    pset.addPrimitive(_noop, 4, name="ifge")
    if function == "step_time":
        for comp in COMPONENT_NAMES:
            pset.addTerminal(f"f.{comp}", name=f"f_{comp}")
    else:
        for fld in REQUEST_FIELDS:
            pset.addTerminal(f"r.{fld}", name=f"r_{fld}")
    for c in constant_names:
        pset.addTerminal(f"c.{c}", name=f"c_{c}")
    pset.addEphemeralConstant("newconst", _new_constant_value)
    return pset


class _NamedNew(gp.Terminal):
    """A new constant with a chosen starting value (rendered as a fresh named constant)."""

    def __init__(self, value: float):
        super().__init__(value, False, object)


def _is_new_constant(node) -> bool:
    return type(type(node)) is gp.MetaEphemeral or isinstance(node, _NamedNew)


def to_tree(program: Program, pset: gp.PrimitiveSet, function: str = "step_time") -> gp.PrimitiveTree:
    fn = program.functions[function]
    local_exprs: dict[str, ast.AST] = {}
    nodes: list = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Constant):
            nodes.append(gp.Terminal(float(node.value), False, object))
        elif isinstance(node, ast.Attribute):
            nodes.append(pset.mapping[f"{node.value.id}_{node.attr}"])
        elif isinstance(node, ast.Name):
            visit(local_exprs[node.id])
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                p = literal_number(node.right)
                if p not in POWERS:
                    raise NotRepresentable(f"exponent {p:g}")
                nodes.append(pset.mapping[POWERS[p]])
                visit(node.left)
            else:
                nodes.append(pset.mapping[BINARY[type(node.op)]])
                visit(node.left)
                visit(node.right)
        elif isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                nodes.append(pset.mapping["neg"])
            visit(node.operand)
        elif isinstance(node, ast.Call):
            name = node.func.id
            if name in UNARY_CALLS:
                nodes.append(pset.mapping[name])
                visit(node.args[0])
            else:  # max/min of n arguments -> left-nested binary primitive
                for _ in node.args[1:]:
                    nodes.append(pset.mapping[f"{name}2"])
                visit(node.args[0])
                for a in node.args[1:]:
                    visit(a)
        elif isinstance(node, ast.IfExp):
            t = node.test
            if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Gt, ast.GtE, ast.Lt, ast.LtE))):
                raise NotRepresentable("condition other than one <, <=, > or >= comparison")
            a, b = t.left, t.comparators[0]
            if isinstance(t.ops[0], (ast.Lt, ast.LtE)):
                a, b = b, a
            nodes.append(pset.mapping["ifgt" if isinstance(t.ops[0], (ast.Gt, ast.Lt)) else "ifge"])
            for x in (a, b, node.body, node.orelse):
                visit(x)
        else:
            raise NotRepresentable(type(node).__name__)

    for stmt in fn.body:
        if isinstance(stmt, ast.Assign):
            local_exprs[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.Return):
            visit(stmt.value)
    return gp.PrimitiveTree(nodes)


def render_tree(tree: gp.PrimitiveTree, existing: set[str]) -> tuple[str, dict[str, float]]:
    """DSL expression text for a tree, plus the new constants its ephemerals became."""
    new: dict[str, float] = {}
    pos = 0

    def next_name() -> str:
        i = 1
        while f"k{i}" in existing or f"k{i}" in new:
            i += 1
        return f"k{i}"

    def walk() -> str:
        nonlocal pos
        node = tree[pos]
        pos += 1
        if isinstance(node, gp.Terminal):
            if _is_new_constant(node):
                name = next_name()
                new[name] = float(node.value)
                return f"c.{name}"
            if isinstance(node.value, str):  # DEAP keeps a named terminal's name: f_<component>, r_<field>, c_<constant>
                return f"{node.value[0]}.{node.value[2:]}"
            v = float(node.value)
            return repr(v) if v >= 0 else f"({v!r})"
        args = [walk() for _ in range(node.arity)]
        n = node.name
        if n in ("add", "sub", "mul", "div"):
            return f"({args[0]} {'+-*/'['add sub mul div'.split().index(n)]} {args[1]})"
        if n in ("max2", "min2"):
            return f"{n[:3]}({args[0]}, {args[1]})"
        if n == "neg":
            return f"(-{args[0]})"
        if n in UNARY_CALLS:
            return f"{n}({args[0]})"
        if n in POWERS.values():
            p = next(k for k, v in POWERS.items() if v == n)
            return f"({args[0]}) ** {p:g}" if p > 0 else f"({args[0]}) ** ({p:g})"
        cmp = ">" if n == "ifgt" else ">="
        return f"({args[2]} if {args[0]} {cmp} {args[1]} else {args[3]})"

    text = walk()
    return _flatten_minmax(ast.unparse(ast.parse(text, mode="eval"))), new


def _flatten_minmax(text: str) -> str:
    """max(max(a, b), c) -> max(a, b, c): same value, easier to read."""
    tree = ast.parse(text, mode="eval")

    class Flatten(ast.NodeTransformer):
        def visit_Call(self, node):
            self.generic_visit(node)
            if isinstance(node.func, ast.Name) and node.func.id in ("max", "min"):
                args = []
                for a in node.args:
                    if isinstance(a, ast.Call) and isinstance(a.func, ast.Name) and a.func.id == node.func.id and len(args) + len(a.args) < 8:
                        args.extend(a.args)
                    else:
                        args.append(a)
                node.args = args
            return node

    return ast.unparse(Flatten().visit(tree))


SIGNATURES = {"step_time": "step_time(f, c)", "queueing_time": "queueing_time(r, c)"}


def assemble(parent: Program, function: str, expr: str, constants: dict[str, float], doc: str) -> str:
    """Program text: `function` replaced by `return expr`, the parent's other functions kept,
    unused constants dropped."""
    parts = []
    for name, fn in parent.functions.items():
        parts.append(f"def {SIGNATURES[name]}:\n    return {expr}" if name == function else ast.unparse(fn))
    body = "\n\n\n".join(parts)
    used = {n.attr for n in ast.walk(ast.parse(body)) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "c"}
    kept = {k: v for k, v in constants.items() if k in used}
    return f'"""{doc}"""\n{render_constants(kept)}\n\n\n{body}\n'


def mutate(operator: str, parent: Program, parent_constants: dict[str, float], rng: random.Random,
           other: Program | None = None, other_constants: dict[str, float] | None = None) -> tuple[str, str]:
    """Apply one symbolic operator; returns (child source, detail). Raises NotRepresentable."""
    random.seed(rng.getrandbits(64))  # DEAP draws from the module-level generator
    names = list(parent.constants)
    if operator == "constants":
        scaled = {k: (v * math.exp(rng.gauss(0.0, 0.3)) if v > 0 else v + rng.gauss(0.0, max(abs(v), 1.0) * 0.3))
                  for k, v in parent_constants.items()}
        text = parent.with_constants(scaled).source
        return text, "perturbed constants (log-normal, sigma 0.3)"
    crossing = operator == "crossover" and other is not None
    all_names = names + ([n for n in other.constants if n not in names] if crossing else [])
    choices = [f for f in MUTABLE_FUNCTIONS if f in parent.functions and (not crossing or f in other.functions)]
    function = rng.choices(choices, weights=[MUTABLE_FUNCTIONS[f] for f in choices])[0]
    pset = primitive_set(all_names, function)
    tree = to_tree(parent, pset, function)
    constants = dict(parent_constants)
    detail = f"{operator} on {function}"
    if operator == "subtree":
        (tree,) = gp.mutUniform(tree, expr=lambda pset, type_: gp.genGrow(pset, 0, 2, type_), pset=pset)
    elif operator == "node_replace":
        (tree,) = gp.mutNodeReplacement(tree, pset)
    elif operator == "insert":
        (tree,) = gp.mutInsert(tree, pset)
    elif operator == "shrink":
        (tree,) = gp.mutShrink(tree)
    elif operator == "add_term":
        # parent + c.k * x: with the refit, a closed-loop forward-stepwise regression step
        term = rng.choice([t for t in pset.terminals[object] if isinstance(t, gp.Terminal) and isinstance(t.value, str)
                           and t.value[0] in "fr"])
        scale = 1.0 if term.value[2:] in TIME_COMPONENTS else 10.0
        tree = gp.PrimitiveTree([pset.mapping["add"], *tree, pset.mapping["mul"], _NamedNew(scale), term])
        detail = f"add_term on {function}: + k * {term.value[0]}.{term.value[2:]}"
    elif operator == "crossover":
        if other is None:
            raise ValueError("crossover needs a second parent")
        tree2 = to_tree(other, pset, function)
        tree, _ = gp.cxOnePoint(tree, tree2)
        for k, v in (other_constants or {}).items():
            constants.setdefault(k, v)
    else:
        raise ValueError(f"unknown symbolic operator {operator!r}")
    if tree.height > MAX_TREE_HEIGHT:
        raise NotRepresentable(f"tree height {tree.height} exceeds {MAX_TREE_HEIGHT}")
    expr, new = render_tree(tree, set(constants))
    constants.update(new)
    if new:
        detail += f" (new constants: {', '.join(new)})"
    return assemble(parent, function, expr, constants, f"{operator} child"), detail
