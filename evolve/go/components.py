"""Go for the physics, generated from the one Python definition: the component formulas
(`components.component_values`), the coefficient function (`components.coefficient_values`)
and one hardware preset per catalog entry (evaluator/hardware/catalog.yaml).

Both functions are parsed from their source and translated node by node; what they may contain
is written above them in evaluator/hardware/components.py. `physics_context(name)` returns every variable
the physics parts of templates/latency_model.go.j2 use.
"""

from __future__ import annotations

import ast
import inspect
import operator
import textwrap

from stepml_evolve.evaluator.dsl.pyparse import parse_python
from stepml_evolve.evaluator.hardware import components as comps_mod
from stepml_evolve.evaluator.hardware.catalog import catalog
from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES, COMPONENTS, N_COEFFICIENTS

from .text import ATOM, BINARY, COMPARISONS, UNARY, EmitError, camel, go_number, go_value, wrap

# Parameter of coefficient_values -> its Go value inside New<Name>Model (arch, hw, tp in scope).
COEFFICIENT_ARGUMENTS = {
    "layers": "float64(arch.NumLayers)",
    "hidden": "float64(arch.HiddenDim)",
    "heads": "float64(arch.NumHeads)",
    "head_dim": "float64(arch.HiddenDim / arch.NumHeads)",  # integer division, as ModelArch.head_dim
    "kv_heads": "float64(arch.NumKVHeads)",
    "ffn": "float64(arch.IntermediateDim)",
    "vocab": "float64(arch.VocabSize)",
    "num_experts": "float64(arch.NumLocalExperts)",
    "top_k": "float64(arch.NumExpertsPerTok)",
    "peak_flops": "hw.PeakFlops",
    "hbm_bytes_per_s": "hw.HBMBytesPerS",
    "link_bytes_per_s": "hw.LinkBytesPerS",
    "tp": "float64(tp)",
}

_OPS = {**BINARY, ast.Div: ("/", BINARY[ast.Mult][1])}  # plain / (the physics never divides by 0): binds like *
_PY_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


def coefficient_slots() -> dict[str, int]:
    """K_* name -> index in the coefficient vector, in slot order."""
    slots = {name: getattr(comps_mod, name) for name in dir(comps_mod) if name.startswith("K_")}
    return dict(sorted(slots.items(), key=lambda kv: kv[1]))


def _literal(node: ast.AST):
    """Python's value of a subtree of literals only (Go would fold it exactly; Python rounds each
    step), else None."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _literal(node.operand)
        return None if v is None else -v
    if isinstance(node, ast.BinOp) and type(node.op) in _PY_OPS:
        left, right = _literal(node.left), _literal(node.right)
        return None if left is None or right is None else _PY_OPS[type(node.op)](left, right)
    return None


class _Translator:
    """One physics function of evaluator/hardware/components.py to Go statements (contract: see there)."""

    def __init__(self, fn, select: str | None = None, receiver_k: bool = False):
        self.name = fn.__name__
        lines, self.first_line = inspect.getsourcelines(fn)
        self.tree = parse_python(textwrap.dedent("".join(lines))).body[0]
        self.params = [a.arg for a in self.tree.args.args]
        self.select = select  # Go helper for `a if x < y else b`; None where conditionals are not allowed
        self.receiver_k = receiver_k  # `k[K_*]` reads the model's coefficients, m.k[i]
        self.go: dict[str, str] = {p: camel(p, upper=False) for p in self.params if not (receiver_k and p == "k")}
        self.reserved = {"math", "m", *(s for s in [select] if s)}

    def fail(self, node: ast.AST, what: str):
        line = self.first_line + getattr(node, "lineno", 1) - 1
        raise EmitError(
            f"components.{self.name} (line {line}): cannot translate {what} to Go; see the contract "
            "above coefficient_values in evaluator/hardware/components.py"
        )

    def body(self) -> tuple[list[str], list[str]]:
        """(Go statements before the return, the returned Python names)."""
        stmts = list(self.tree.body)
        if stmts and isinstance(stmts[0], ast.Expr) and isinstance(getattr(stmts[0].value, "value", None), str):
            stmts = stmts[1:]  # docstring
        if not stmts or not isinstance(stmts[-1], ast.Return):
            self.fail(self.tree, "a function that does not end in a return")
        used = {n.id for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        lines = []
        for stmt in stmts[:-1]:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
                self.fail(stmt, f"the statement {type(stmt).__name__} (only `name = expression`)")
            target = stmt.targets[0].id
            if target in self.go or (target == "k" and self.receiver_k):
                self.fail(stmt, f"assigning {target} again (each name is assigned once)")
            expr = self.expr(stmt.value)
            go = camel(target, upper=False)
            if go in self.go.values() or go in self.reserved:
                self.fail(stmt, f"the name {target} (its Go name {go} is taken)")
            self.go[target] = go
            lines.append(f"{go} := {expr}")
            if target not in used:
                lines.append(f"_ = {go}")
        ret = stmts[-1].value
        if not (isinstance(ret, ast.Tuple) and all(isinstance(e, ast.Name) and e.id in self.go for e in ret.elts)):
            self.fail(stmts[-1], "a return that is not a tuple of names")
        return lines, [e.id for e in ret.elts]

    def expr(self, node: ast.AST) -> str:
        return self._expr(node)[0]

    def _expr(self, node: ast.AST) -> tuple[str, int]:
        """(Go text, precedence); the right operand keeps parentheses at equal precedence (float
        arithmetic is not associative), products are rounded explicitly (no FMA fusion)."""
        try:
            value = _literal(node)
        except (ArithmeticError, ValueError):
            self.fail(node, f"the literal arithmetic `{ast.unparse(node)}` (it fails in Python)")
        if value is not None:
            return go_value(value), ATOM
        if isinstance(node, ast.Name):
            if node.id in self.go:
                return self.go[node.id], ATOM
            constant = getattr(comps_mod, node.id, None) if node.id.isupper() and not node.id.startswith("K_") else None
            if type(constant) in (int, float):
                return go_value(constant), ATOM
            self.fail(node, f"the name {node.id}")
        if (
            isinstance(node, ast.Subscript)
            and self.receiver_k
            and isinstance(node.value, ast.Name)
            and node.value.id == "k"
            and isinstance(node.slice, ast.Name)
            and node.slice.id in coefficient_slots()
        ):
            return f"m.k[{coefficient_slots()[node.slice.id]}]", ATOM
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            return f"math.Pow({self.expr(node.left)}, {self.expr(node.right)})", ATOM
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            op, prec = _OPS[type(node.op)]
            (left, lp), (right, rp) = self._expr(node.left), self._expr(node.right)
            if isinstance(node.op, ast.Mult):
                return f"float64({wrap(left, lp < prec)} * {wrap(right, rp <= prec)})", ATOM
            return f"{wrap(left, lp < prec)} {op} {wrap(right, rp <= prec)}", prec
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner, p = self._expr(node.operand)
            return f"-{wrap(inner, p < ATOM)}", UNARY
        if isinstance(node, ast.IfExp) and self.select:
            test = node.test
            if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in COMPARISONS):
                self.fail(node, "a condition other than one comparison")
            cond = f"{self.expr(test.left)} {COMPARISONS[type(test.ops[0])]} {self.expr(test.comparators[0])}"
            return f"{self.select}({cond}, {self.expr(node.body)}, {self.expr(node.orelse)})", ATOM
        self.fail(node, f"`{ast.unparse(node)}`")


def component_formulas_go(struct: str) -> list[str]:
    """Go statements computing the components from batch totals (in a method of the model, whose
    coefficients are m.k), translated from `component_values`; they return a `struct`."""
    t = _Translator(comps_mod.component_values, receiver_k=True)
    lines, names = t.body()
    if names != COMPONENT_NAMES:
        t.fail(t.tree.body[-1], "a return that is not the components in COMPONENTS order")
    fields = ", ".join(f"{camel(n)}: {t.go[n]}" for n in names)
    return [*lines, f"return {struct}{{{fields}}}"]


def coefficient_function_go(select: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The Go function computing the coefficient vector, translated from `coefficient_values`:
    ([(Go parameter, its value in New<Name>Model)], body lines). `select` is the Go helper
    Select(cond, a, b) that stands for Python's `a if cond else b`."""
    t = _Translator(comps_mod.coefficient_values, select=select)
    missing = [p for p in t.params if p not in COEFFICIENT_ARGUMENTS]
    if missing:
        t.fail(
            t.tree,
            f"the parameter(s) {', '.join(missing)} (add their Go values to COEFFICIENT_ARGUMENTS in evolve/go/components.py)",
        )
    lines, names = t.body()
    slots = coefficient_slots()
    expected = [slot[2:].lower() for slot in slots]
    if names != expected or list(slots.values()) != list(range(N_COEFFICIENTS)):
        t.fail(t.tree.body[-1], f"a return other than ({', '.join(expected)}), the K_* slots in order")
    width = max(len(t.go[n]) for n in names) + 1
    returned = [f"\t{t.go[n] + ',':<{width}} // {slot}" for n, slot in zip(names, slots)]
    params = [(t.go[p], COEFFICIENT_ARGUMENTS[p]) for p in t.params]
    return params, [*lines, f"return [{N_COEFFICIENTS}]float64{{", *returned, "}"]


def hardware_presets() -> list[dict[str, str]]:
    """One Go preset per catalog hardware: the name suffix, a comment and the field values."""
    presets = []
    for hw in catalog().hardware.values():
        presets.append(
            {
                "go_name": hw.go_name,
                "comment": (
                    f'is the {hw.description} ("{hw.name}" in the catalog): '
                    f"{hw.peak_flops / 1e12:g} TFLOP/s BF16 dense, "
                    f"{hw.hbm_bytes_per_s / 1e12:g} TB/s HBM, {hw.link_bytes_per_s / 1e9:g} GB/s NVLink."
                ),
                "fields": (
                    f"PeakFlops: {go_number(hw.peak_flops)}, HBMBytesPerS: {go_number(hw.hbm_bytes_per_s)}, "
                    f"LinkBytesPerS: {go_number(hw.link_bytes_per_s)}"
                ),
            }
        )
    return presets


def physics_context(name: str) -> dict:
    """Template variables of the physics for the Go model `name` (helpers are prefixed with
    name's lower-camel form, as go_source does)."""
    from stepml_evolve.evaluator.physics.floor import ADDED_TIMES, BYTE_TIMES, FLOP_TIMES
    from stepml_evolve.evaluator.physics.floor import TOLERANCE as FLOOR_TOLERANCE

    prefix = name[:1].lower() + name[1:]
    params, code = coefficient_function_go(select=f"{prefix}Select")
    return {
        "components": [(camel(n), unit, meaning) for n, unit, meaning in COMPONENTS],
        "formulas": component_formulas_go(f"{name}Components"),
        "n_coefficients": N_COEFFICIENTS,
        "coefficient_params": [go for go, _ in params],
        "coefficient_args": [(value, go) for go, value in params],
        "coefficient_code": code,
        "hardware_presets": hardware_presets(),
        "floor_parts": {
            part: " + ".join(f"f.{camel(n)}" for n in names)
            for part, names in (("flops", FLOP_TIMES), ("bytes", BYTE_TIMES), ("added", ADDED_TIMES))
        },
        "floor_tolerance": go_number(FLOOR_TOLERANCE),
    }
