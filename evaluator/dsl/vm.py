"""Scalar compilation: a validated program becomes a small stack-machine code array.

The code is produced by our own code generator from the validated AST and is interpreted
by `run_code`, a numba-compiled loop. One interpreter is compiled once for every program,
so a new program costs no JIT time and no program text is ever executed. Semantics shared
with the numexpr and Go back ends:
  a / b      -> 0 where b == 0
  x ** p     -> x**p for integer p, |x|**p otherwise (p is a literal, |p| <= 4)
  sqrt(x)    -> sqrt(|x|);  log(x) -> log(|x|), 0 at x == 0;  exp(x) -> exp(min(x, 80))
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..components import COMPONENT_INDEX
from .program import FUNCTIONS, REQUEST_FIELDS, Program, ProgramError, literal_number

(OP_LIT, OP_COMP, OP_CONST, OP_REQ, OP_LOAD, OP_STORE, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_NEG,
 OP_POWI, OP_POWF, OP_MAX, OP_MIN, OP_ABS, OP_SQRT, OP_LOG, OP_EXP, OP_LT, OP_LE, OP_GT, OP_GE,
 OP_EQ, OP_NE, OP_AND, OP_OR, OP_NOT, OP_SELECT, OP_RET) = range(30)

EXP_CLAMP = 80.0
STACK_SIZE = 64
LOCALS_SIZE = 40
FUNCTION_SLOTS = list(FUNCTIONS)  # entry order: step_time, queueing_time, output_token_time, post_decode_time

_BIN = {ast.Add: OP_ADD, ast.Sub: OP_SUB, ast.Mult: OP_MUL, ast.Div: OP_DIV}
_CMP = {ast.Lt: OP_LT, ast.LtE: OP_LE, ast.Gt: OP_GT, ast.GtE: OP_GE, ast.Eq: OP_EQ, ast.NotEq: OP_NE}
_CALL1 = {"abs": OP_ABS, "sqrt": OP_SQRT, "log": OP_LOG, "exp": OP_EXP}


@dataclass(frozen=True)
class CompiledProgram:
    """Code for every DSL function; entries[i] is the start of FUNCTION_SLOTS[i] or -1."""

    code: np.ndarray  # int64 (n, 2): opcode, argument
    literals: np.ndarray  # float64
    entries: np.ndarray  # int64 (4,)
    constant_names: tuple[str, ...]


class _Emitter:
    def __init__(self, program: Program):
        self.consts = {n: i for i, n in enumerate(program.constants)}
        self.code: list[tuple[int, int]] = []
        self.lits: list[float] = []
        self.depth = 0
        self.max_depth = 0

    def lit(self, v: float) -> int:
        self.lits.append(float(v))
        return len(self.lits) - 1

    def emit(self, op: int, arg: int = 0, pops: int = 0, pushes: int = 0) -> None:
        self.code.append((op, arg))
        self.depth += pushes - pops
        self.max_depth = max(self.max_depth, self.depth)

    def function(self, fn: ast.FunctionDef) -> None:
        slots: dict[str, int] = {}
        for stmt in fn.body:
            if isinstance(stmt, ast.Assign):
                self.expr(stmt.value, slots)
                name = stmt.targets[0].id
                slots.setdefault(name, len(slots))
                self.emit(OP_STORE, slots[name], pops=1)
            elif isinstance(stmt, ast.Return):
                self.expr(stmt.value, slots)
                self.emit(OP_RET, 0, pops=1)

    def expr(self, node: ast.AST, slots: dict[str, int]) -> None:
        if isinstance(node, ast.Constant):
            self.emit(OP_LIT, self.lit(node.value), pushes=1)
        elif isinstance(node, ast.Attribute):
            base = node.value.id
            if base == "f":
                self.emit(OP_COMP, COMPONENT_INDEX[node.attr], pushes=1)
            elif base == "c":
                self.emit(OP_CONST, self.consts[node.attr], pushes=1)
            else:
                self.emit(OP_REQ, REQUEST_FIELDS.index(node.attr), pushes=1)
        elif isinstance(node, ast.Name):
            self.emit(OP_LOAD, slots[node.id], pushes=1)
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                p = literal_number(node.right)
                self.expr(node.left, slots)
                self.emit(OP_POWI if float(p).is_integer() else OP_POWF, self.lit(p), pops=1, pushes=1)
            else:
                self.expr(node.left, slots)
                self.expr(node.right, slots)
                self.emit(_BIN[type(node.op)], pops=2, pushes=1)
        elif isinstance(node, ast.UnaryOp):
            self.expr(node.operand, slots)
            if isinstance(node.op, ast.USub):
                self.emit(OP_NEG, pops=1, pushes=1)
        elif isinstance(node, ast.Call):
            name = node.func.id
            if name in _CALL1:
                self.expr(node.args[0], slots)
                self.emit(_CALL1[name], pops=1, pushes=1)
            else:
                self.expr(node.args[0], slots)
                for a in node.args[1:]:
                    self.expr(a, slots)
                    self.emit(OP_MAX if name == "max" else OP_MIN, pops=2, pushes=1)
        elif isinstance(node, ast.IfExp):
            self.expr(node.body, slots)
            self.expr(node.orelse, slots)
            self.cond(node.test, slots)
            self.emit(OP_SELECT, pops=3, pushes=1)
        else:  # the validator admits nothing else
            raise TypeError(f"cannot compile {type(node).__name__}")

    def cond(self, node: ast.AST, slots: dict[str, int]) -> None:
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                self.expr(operands[i], slots)
                self.expr(operands[i + 1], slots)
                self.emit(_CMP[type(op)], pops=2, pushes=1)
                if i:
                    self.emit(OP_AND, pops=2, pushes=1)
        elif isinstance(node, ast.BoolOp):
            self.cond(node.values[0], slots)
            for v in node.values[1:]:
                self.cond(v, slots)
                self.emit(OP_AND if isinstance(node.op, ast.And) else OP_OR, pops=2, pushes=1)
        else:  # Not
            self.cond(node.operand, slots)
            self.emit(OP_NOT, pops=1, pushes=1)


def compile_program(program: Program) -> CompiledProgram:
    em = _Emitter(program)
    entries = np.full(len(FUNCTION_SLOTS), -1, dtype=np.int64)
    for i, name in enumerate(FUNCTION_SLOTS):
        if name in program.functions:
            entries[i] = len(em.code)
            em.function(program.functions[name])
    if em.max_depth > STACK_SIZE:
        raise ProgramError(None, "depth", f"program needs an evaluation stack of {em.max_depth} (> {STACK_SIZE})")
    return CompiledProgram(
        code=np.array(em.code, dtype=np.int64).reshape(-1, 2),
        literals=np.array(em.lits or [0.0], dtype=np.float64),
        entries=entries,
        constant_names=tuple(program.constants),
    )


@njit(cache=True, nogil=True)
def run_code(code, lits, pc, comps, consts, req, stack, local):
    """Evaluate the function starting at pc; returns float64 (NaN/inf pass through)."""
    sp = 0
    while True:
        op = code[pc, 0]
        arg = code[pc, 1]
        pc += 1
        if op == OP_COMP:
            stack[sp] = comps[arg]
            sp += 1
        elif op == OP_CONST:
            stack[sp] = consts[arg]
            sp += 1
        elif op == OP_LIT:
            stack[sp] = lits[arg]
            sp += 1
        elif op == OP_MUL:
            sp -= 1
            stack[sp - 1] = stack[sp - 1] * stack[sp]
        elif op == OP_ADD:
            sp -= 1
            stack[sp - 1] = stack[sp - 1] + stack[sp]
        elif op == OP_LOAD:
            stack[sp] = local[arg]
            sp += 1
        elif op == OP_STORE:
            sp -= 1
            local[arg] = stack[sp]
        elif op == OP_MAX:
            sp -= 1
            if stack[sp] > stack[sp - 1]:
                stack[sp - 1] = stack[sp]
        elif op == OP_MIN:
            sp -= 1
            if stack[sp] < stack[sp - 1]:
                stack[sp - 1] = stack[sp]
        elif op == OP_SUB:
            sp -= 1
            stack[sp - 1] = stack[sp - 1] - stack[sp]
        elif op == OP_DIV:
            sp -= 1
            b = stack[sp]
            stack[sp - 1] = stack[sp - 1] / b if b != 0.0 else 0.0
        elif op == OP_NEG:
            stack[sp - 1] = -stack[sp - 1]
        elif op == OP_RET:
            return stack[sp - 1]
        elif op == OP_POWI:
            stack[sp - 1] = stack[sp - 1] ** lits[arg]
        elif op == OP_POWF:
            stack[sp - 1] = abs(stack[sp - 1]) ** lits[arg]
        elif op == OP_ABS:
            stack[sp - 1] = abs(stack[sp - 1])
        elif op == OP_SQRT:
            stack[sp - 1] = np.sqrt(abs(stack[sp - 1]))
        elif op == OP_LOG:
            x = abs(stack[sp - 1])
            stack[sp - 1] = np.log(x) if x > 0.0 else 0.0
        elif op == OP_EXP:
            x = stack[sp - 1]
            stack[sp - 1] = np.exp(x if x < EXP_CLAMP else EXP_CLAMP)
        elif op == OP_REQ:
            stack[sp] = req[arg]
            sp += 1
        elif op == OP_SELECT:
            sp -= 2
            if stack[sp + 1] == 0.0:
                stack[sp - 1] = stack[sp]
        elif op == OP_LT:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] < stack[sp] else 0.0
        elif op == OP_LE:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] <= stack[sp] else 0.0
        elif op == OP_GT:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] > stack[sp] else 0.0
        elif op == OP_GE:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] >= stack[sp] else 0.0
        elif op == OP_EQ:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] == stack[sp] else 0.0
        elif op == OP_NE:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] != stack[sp] else 0.0
        elif op == OP_AND:
            sp -= 1
            stack[sp - 1] = 1.0 if (stack[sp - 1] != 0.0 and stack[sp] != 0.0) else 0.0
        elif op == OP_OR:
            sp -= 1
            stack[sp - 1] = 1.0 if (stack[sp - 1] != 0.0 or stack[sp] != 0.0) else 0.0
        elif op == OP_NOT:
            stack[sp - 1] = 1.0 if stack[sp - 1] == 0.0 else 0.0
        else:
            return np.nan


class ScalarProgram:
    """Python-callable view of a compiled program (tests, reports; the replay calls run_code)."""

    def __init__(self, compiled: CompiledProgram):
        self.c = compiled
        self._stack = np.zeros(STACK_SIZE)
        self._local = np.zeros(LOCALS_SIZE)
        self._empty = np.zeros(1)

    def _run(self, slot: str, comps, consts, req) -> float:
        pc = self.c.entries[FUNCTION_SLOTS.index(slot)]
        if pc < 0:
            return 0.0
        return float(run_code(self.c.code, self.c.literals, pc, np.asarray(comps, dtype=np.float64),
                              np.asarray(consts, dtype=np.float64), np.asarray(req, dtype=np.float64),
                              self._stack, self._local))

    def step_time(self, comps, consts) -> float:
        return self._run("step_time", comps, consts, self._empty)

    def queueing_time(self, input_tokens, output_tokens, consts) -> float:
        return self._run("queueing_time", self._empty, consts, np.array([input_tokens, output_tokens], dtype=np.float64))

    def output_token_time(self, consts) -> float:
        return self._run("output_token_time", self._empty, consts, self._empty)

    def post_decode_time(self, consts) -> float:
        return self._run("post_decode_time", self._empty, consts, self._empty)
