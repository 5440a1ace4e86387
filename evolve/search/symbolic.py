"""Symbolic mutation operators on a program's step_time, with DEAP's GP tools.

A program's step_time (locals inlined) becomes a DEAP PrimitiveTree; DEAP mutates or crosses
trees; the result is rendered back to DSL text and goes through the same validator as LLM
output. DEAP never compiles or evaluates anything here: its primitives are names only.
New ephemeral constants become named constants (k1, k2, ...) that the fit then tunes; they are
unbounded. Constants a child keeps keep their bounds (`Program.bounds`: the parent's, or for
crossover the second parent's for constants taken from it), and their values are moved into them.
Randomness comes from the `random` module, which the caller seeds per child.
The primitives are the operator table's rows that name one (`evaluator/dsl/operators.py`).
"""

from __future__ import annotations

import ast
import math
import random

from deap import gp

from stepml_evolve.evaluator.dsl import REQUEST_FIELDS, Program
from stepml_evolve.evaluator.dsl.operators import OPERATORS as DSL_OPERATORS
from stepml_evolve.evaluator.dsl.operators import Kind, Operator, operands, operator_of
from stepml_evolve.evaluator.dsl.program import clip_to, literal_number, render_constants
from stepml_evolve.evaluator.dsl.pyparse import parse_python
from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES, TIME_COMPONENTS

MAX_TREE_HEIGHT = 12
# the exponents GP writes, each its own primitive (pow2, pow0_5, powm1, ...); others are left to the LLM
POWER_EXPONENTS = (2.0, 3.0, 0.5, 1.5, -1.0, -0.5, -2.0)
OPERATORS = ("subtree", "node_replace", "insert", "shrink", "crossover", "constants", "add_term", "modulate", "switch")
COUNT_COMPONENTS = [c for c in COMPONENT_NAMES if c not in TIME_COMPONENTS]
# a count's order of magnitude in one serving step: `modulate` starts its new constant where the
# factor it adds is about 1.1, so the child starts near its parent and the fit moves it
TYPICAL_COUNT = {
    "experts": 32.0,  # touched per layer: all of Mixtral's 8 and most of OLMoE's 64 in a batch of tens of tokens
    "n_req": 32.0,
    "n_pf": 1.0,
    "n_dc": 32.0,
    "tok_pf": 256.0,
    "tokens": 256.0,
    "ctx_sum": 32768.0,
    "ctx_max": 1024.0,
    "layers": 48.0,
    "tp": 2.0,
}
# a request's fields (queueing_time's r.*) at their orders of magnitude: prompts of a few hundred to
# a few thousand tokens, outputs of a few hundred, a step in flight of tens of milliseconds
TYPICAL_REQUEST = {"input_tokens": 1000.0, "output_tokens": 250.0, "last_step_us": 20000.0}
# what a new term k * x of `add_term` adds at its start, for a count or a request field x: about what
# k * f.n_req added when every such term started at k = 10, so small counts start where they did and
# large ones no longer start at a step's whole time or more (k * f.ctx_sum at k = 10 added a third of
# a second a step; no screening fit came back from it: docs/HISTORY.md, "New terms start small")
TERM_START_US = 300.0
# the counts of a step a kernel or a code path changes with: `switch` conditions on one of them
# (not layers, tp or experts, which one deployment holds fixed)
SWITCH_COUNTS = ("n_req", "n_pf", "n_dc", "tok_pf", "tokens", "ctx_sum", "ctx_max")
MUTABLE_FUNCTIONS = {"step_time": 0.8, "queueing_time": 0.2}  # which function a structural operator edits


class NotRepresentable(ValueError):
    """The program uses a construct the GP tree cannot express (e.g. `and` in a condition)."""


def _noop(*args):  # primitives are never called: trees are rendered to text, not compiled
    return 0.0


def _new_constant_value() -> float:
    return round(10 ** random.uniform(-1.0, 3.0), 4)


def _power_name(op: Operator, p: float) -> str:
    return op.gp + f"{p:g}".replace("-", "m").replace(".", "_")


def _gp_arity(op: Operator) -> int:
    if op.kind is Kind.COMPARE:
        return 4  # ifgt(a, b, then, else)
    if op.exponent:
        return 1  # the exponent is part of the name
    return op.arity[0]  # max(a, b, ...) becomes max2(a, b)


_POWER = next(op for op in DSL_OPERATORS if op.exponent)  # both ** rows render alike: (x) ** p
POWERS = {p: _power_name(_POWER, p) for p in POWER_EXPONENTS}  # exponent -> primitive name
_BY_PRIMITIVE = {op.gp: op for op in DSL_OPERATORS if op.gp and not op.exponent}
_COMPARISONS = {op.symbol: op for op in DSL_OPERATORS if op.kind is Kind.COMPARE}
_MIRRORED = {"<": ">", "<=": ">="}  # a < b is b > a: GP has if-primitives for > and >= only


def _primitives() -> list[tuple[str, int]]:
    """(name, arity) of the primitives in the order DEAP must see them, since its random choices
    depend on it: the binary ones, then the unary ones, then the if-primitives, each in table order."""
    arities: dict[str, int] = {}
    for op in DSL_OPERATORS:
        for name in POWERS.values() if op.exponent else [op.gp] if op.gp else []:
            arities.setdefault(name, _gp_arity(op))
    return sorted(arities.items(), key=lambda item: (2, 1, 4).index(item[1]))


PRIMITIVES = _primitives()


# what a causal search never draws (evaluator/physics/rules.py): f.tp is 1 at TP 1, so a term in it
# charges deployments without tensor parallelism; queueing_time cannot know r.output_tokens
NOT_DRAWN_CAUSAL = {"step_time": ("f.tp",), "queueing_time": ("r.output_tokens",)}


def primitive_set(
    constant_names: list[str], function: str = "step_time", causal: bool = False, keep: frozenset[str] = frozenset()
) -> gp.PrimitiveSet:
    """The primitives, the function's inputs and the constants; `causal`: without the inputs of
    NOT_DRAWN_CAUSAL but those in `keep` (the parent's own reads, which its tree must hold)."""
    pset = gp.PrimitiveSet(function, 0)
    for name, arity in PRIMITIVES:
        pset.addPrimitive(_noop, arity, name=name)
    skip = {x for x in NOT_DRAWN_CAUSAL.get(function, ()) if x not in keep} if causal else set()
    if function == "step_time":
        for comp in COMPONENT_NAMES:
            if f"f.{comp}" not in skip:
                pset.addTerminal(f"f.{comp}", name=f"f_{comp}")
    else:
        for fld in REQUEST_FIELDS:
            if f"r.{fld}" not in skip:
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
        op = operator_of(node)
        if isinstance(node, ast.Constant):
            nodes.append(gp.Terminal(float(node.value), False, object))
        elif isinstance(node, ast.Attribute):
            nodes.append(pset.mapping[f"{node.value.id}_{node.attr}"])
        elif isinstance(node, ast.Name):
            visit(local_exprs[node.id])
        elif op is None or op.kind.in_condition:
            raise NotRepresentable(type(node).__name__)
        elif op.exponent:
            p = literal_number(node.right)
            if p not in POWERS:
                raise NotRepresentable(f"exponent {p:g}")
            nodes.append(pset.mapping[POWERS[p]])
            visit(node.left)
        elif op.kind is Kind.IF_ELSE:
            test = _if_primitive(node.test)
            if test is None:
                raise NotRepresentable("condition other than one <, <=, > or >= comparison")
            cmp, a, b = test
            nodes.append(pset.mapping[cmp.gp])
            for x in (a, b, node.body, node.orelse):
                visit(x)
        elif op.identity:
            visit(node.operand)
        elif op.gp is None:
            raise NotRepresentable(op.symbol)
        else:  # max/min of n arguments: n - 1 left-nested binary primitives
            args = operands(node)
            nodes.extend([pset.mapping[op.gp]] * max(len(args) - 1, 1))
            for a in args:
                visit(a)

    for stmt in fn.body:
        if isinstance(stmt, ast.Assign):
            local_exprs[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.Return):
            visit(stmt.value)
    return gp.PrimitiveTree(nodes)


def _if_primitive(test: ast.AST) -> tuple[Operator, ast.AST, ast.AST] | None:
    """For a test GP can hold (one comparison with an if-primitive, a < b read as b > a):
    the comparison's row and its two operands; None for any other test."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    symbol, a, b = operator_of(test.ops[0]).symbol, test.left, test.comparators[0]
    if symbol in _MIRRORED:
        symbol, a, b = _MIRRORED[symbol], b, a
    op = _COMPARISONS[symbol]
    return (op, a, b) if op.gp else None


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
            if isinstance(
                node.value, str
            ):  # DEAP keeps a named terminal's name: f_<component>, r_<field>, c_<constant>
                return f"{node.value[0]}.{node.value[2:]}"
            v = float(node.value)
            return repr(v) if v >= 0 else f"({v!r})"
        args = [walk() for _ in range(node.arity)]
        if node.name in POWERS.values():
            p = next(k for k, v in POWERS.items() if v == node.name)
            return f"({args[0]}) ** {p:g}" if p > 0 else f"({args[0]}) ** ({p:g})"
        op = _BY_PRIMITIVE[node.name]
        if op.kind is Kind.BINARY:
            return f"({args[0]} {op.symbol} {args[1]})"
        if op.kind is Kind.UNARY:
            return f"({op.symbol}{args[0]})"
        if op.kind is Kind.CALL:
            return f"{op.symbol}({', '.join(args)})"
        return f"({args[2]} if {args[0]} {op.symbol} {args[1]} else {args[3]})"  # ifgt(a, b, then, else)

    text = walk()
    return _flatten_minmax(ast.unparse(parse_python(text, "eval"))), new


def _flatten_minmax(text: str) -> str:
    """max(max(a, b), c) -> max(a, b, c): same value, easier to read."""
    tree = parse_python(text, "eval")

    class Flatten(ast.NodeTransformer):
        def visit_Call(self, node):
            self.generic_visit(node)
            if isinstance(node.func, ast.Name) and node.func.id in ("max", "min"):
                args = []
                for a in node.args:
                    if (
                        isinstance(a, ast.Call)
                        and isinstance(a.func, ast.Name)
                        and a.func.id == node.func.id
                        and len(args) + len(a.args) < 8
                    ):
                        args.extend(a.args)
                    else:
                        args.append(a)
                node.args = args
            return node

    return ast.unparse(Flatten().visit(tree))


SIGNATURES = {"step_time": "step_time(f, c)", "queueing_time": "queueing_time(r, c)"}


def _time_component_spots(tree: gp.PrimitiveTree) -> list[int]:
    """Where the tree holds a time component f.T."""
    return [
        i
        for i, node in enumerate(tree)
        if isinstance(node, gp.Terminal)
        and isinstance(node.value, str)
        and node.value[0] == "f"
        and node.value[2:] in TIME_COMPONENTS
    ]


def term_start(value: str) -> float:
    """The starting constant of add_term's new term k * x (value: "f.x" or "r.x"): 1 for a time
    component (the term starts at that component's own time), else what adds TERM_START_US at x's
    typical size, so the child starts near its parent and its fit moves k from there."""
    kind, name = value[0], value[2:]
    if kind == "f" and name in TIME_COMPONENTS:
        return 1.0
    typical = TYPICAL_COUNT[name] if kind == "f" else TYPICAL_REQUEST[name]
    return float(f"{TERM_START_US / typical:.4g}")


def _modulate(
    tree: gp.PrimitiveTree, pset: gp.PrimitiveSet, rng: random.Random, causal: bool = False
) -> tuple[gp.PrimitiveTree, str]:
    """One time component f.T of the tree becomes f.T * (1 + k * f.n) or f.T * (1 + k / f.n), n a
    count of the step: an efficiency that changes with the step's size (tiles a GEMM fills, the
    experts a batch touches, a kernel's fixed cost spread over its tokens). Subtree mutations
    rarely build this shape; the laws of serving kernels are full of it."""
    spots = _time_component_spots(tree)
    if not spots:
        raise NotRepresentable("step_time has no time component to modulate")
    i = rng.choice(spots)
    count = rng.choice([c for c in COUNT_COMPONENTS if not causal or f"f_{c}" in pset.mapping])
    n = pset.mapping[f"f_{count}"]
    if rng.random() < 0.5:
        factor, shape = [pset.mapping["mul"], _NamedNew(0.1 / TYPICAL_COUNT[count]), n], f"k * f.{count}"
    else:
        factor, shape = [pset.mapping["div"], _NamedNew(0.1 * TYPICAL_COUNT[count]), n], f"k / f.{count}"
    one = gp.Terminal(1.0, False, object)
    modulated = [pset.mapping["mul"], tree[i], pset.mapping["add"], one, *factor]
    detail = f"modulate on step_time: f.{tree[i].value[2:]} * (1 + {shape})"
    return gp.PrimitiveTree(tree[:i] + modulated + tree[i + 1 :]), detail


def _switch(tree: gp.PrimitiveTree, pset: gp.PrimitiveSet, rng: random.Random) -> tuple[gp.PrimitiveTree, str]:
    """A change of regime at a threshold t of a step's count n (a new constant the fit moves): half
    the time one time component f.T of the tree becomes (f.T * k if f.n > t else f.T), a kernel
    that is faster or slower above a size; else the tree gains + (k * X if f.n > t else 0), X a
    count or 1, a code path taken only above it (a split-KV reduction per layer past a context
    length, eager launches once a step holds a prefill). Neither subtree mutation nor add_term
    builds a condition on a threshold; kernels and schedulers are full of them."""
    count = rng.choice(SWITCH_COUNTS)
    threshold = _NamedNew(round(TYPICAL_COUNT[count] * 2.0 ** rng.uniform(-2.0, 2.0), 4))
    ifgt = pset.mapping[_COMPARISONS[">"].gp]
    condition = [pset.mapping[f"f_{count}"], threshold]
    spots = _time_component_spots(tree)
    if spots and rng.random() < 0.5:
        i = rng.choice(spots)
        component = tree[i]
        scaled = [ifgt, *condition, pset.mapping["mul"], component, _NamedNew(1.1), component]
        detail = f"switch on step_time: f.{component.value[2:]} * k above f.{count} > t"
        return gp.PrimitiveTree(tree[:i] + scaled + tree[i + 1 :]), detail
    extra = rng.choice([*COUNT_COMPONENTS, None])
    zero = gp.Terminal(0.0, False, object)
    if extra is None:
        gated, what = [_NamedNew(10.0)], "k"
    else:
        gated, what = (
            [pset.mapping["mul"], _NamedNew(term_start(f"f.{extra}")), pset.mapping[f"f_{extra}"]],
            f"k * f.{extra}",
        )
    detail = f"switch on step_time: + {what} above f.{count} > t"
    return gp.PrimitiveTree([pset.mapping["add"], *tree, ifgt, *condition, *gated, zero]), detail


def assemble(
    parent: Program,
    function: str,
    expr: str,
    constants: dict[str, float],
    doc: str,
    bounds: dict[str, tuple[float, float]] | None = None,
    priors: dict | None = None,
) -> str:
    """Program text: `function` replaced by `return expr`, the parent's other functions kept,
    unused constants dropped; kept constants keep their `bounds` and `priors` (default: the
    parent's), values moved into the bounds."""
    bounds = parent.bounds if bounds is None else bounds
    priors = parent.priors if priors is None else priors
    parts = []
    for name, fn in parent.functions.items():
        parts.append(f"def {SIGNATURES[name]}:\n    return {expr}" if name == function else ast.unparse(fn))
    body = "\n\n\n".join(parts)
    used = {
        n.attr
        for n in ast.walk(parse_python(body))
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "c"
    }
    kept = {k: clip_to(v, bounds.get(k)) for k, v in constants.items() if k in used}
    return f'"""{doc}"""\n{render_constants(kept, bounds, priors)}\n\n\n{body}\n'


def mutate(
    operator: str,
    parent: Program,
    parent_constants: dict[str, float],
    rng: random.Random,
    other: Program | None = None,
    other_constants: dict[str, float] | None = None,
    causal: bool = False,
) -> tuple[str, str]:
    """Apply one symbolic operator; returns (child source, detail). Raises NotRepresentable.
    causal: draw no input a causal search refuses (NOT_DRAWN_CAUSAL) the parents do not read."""
    random.seed(rng.getrandbits(64))  # DEAP draws from the module-level generator
    names = list(parent.constants)
    if operator == "constants":
        scaled = {
            k: (v * math.exp(rng.gauss(0.0, 0.3)) if v > 0 else v + rng.gauss(0.0, max(abs(v), 1.0) * 0.3))
            for k, v in parent_constants.items()
        }
        text = parent.with_constants(parent.clip(scaled)).source  # bounded ones stay inside their bounds
        return text, "perturbed constants (log-normal, sigma 0.3)"
    crossing = operator == "crossover" and other is not None
    all_names = names + ([n for n in other.constants if n not in names] if crossing else [])
    choices = [f for f in MUTABLE_FUNCTIONS if f in parent.functions and (not crossing or f in other.functions)]
    function = rng.choices(choices, weights=[MUTABLE_FUNCTIONS[f] for f in choices])[0]
    if operator in ("modulate", "switch"):
        function = "step_time"  # the only function with time components and step counts
    reads = parent.inputs | (other.inputs if crossing else frozenset())
    pset = primitive_set(all_names, function, causal, reads)
    tree = to_tree(parent, pset, function)
    constants = dict(parent_constants)
    bounds = dict(parent.bounds)
    priors = dict(parent.priors)
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
        term = rng.choice(
            [
                t
                for t in pset.terminals[object]
                if isinstance(t, gp.Terminal) and isinstance(t.value, str) and t.value[0] in "fr"
            ]
        )
        tree = gp.PrimitiveTree(
            [pset.mapping["add"], *tree, pset.mapping["mul"], _NamedNew(term_start(term.value)), term]
        )
        detail = f"add_term on {function}: + k * {term.value[0]}.{term.value[2:]}"
    elif operator == "modulate":
        tree, detail = _modulate(tree, pset, rng, causal)
    elif operator == "switch":
        tree, detail = _switch(tree, pset, rng)
    elif operator == "crossover":
        if other is None:
            raise ValueError("crossover needs a second parent")
        tree2 = to_tree(other, pset, function)
        tree, _ = gp.cxOnePoint(tree, tree2)
        for k, v in (other_constants or {}).items():
            constants.setdefault(k, v)
            if k not in parent.constants and k in other.bounds:
                bounds[k] = other.bounds[k]
            if k not in parent.constants and k in other.priors:
                priors[k] = other.priors[k]
    else:
        raise ValueError(f"unknown symbolic operator {operator!r}")
    if tree.height > MAX_TREE_HEIGHT:
        raise NotRepresentable(f"tree height {tree.height} exceeds {MAX_TREE_HEIGHT}")
    expr, new = render_tree(tree, set(constants))
    constants.update(new)
    if new:
        detail += f" (new constants: {', '.join(new)})"
    return assemble(parent, function, expr, constants, f"{operator} child", bounds, priors), detail
