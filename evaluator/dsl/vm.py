"""Scalar compilation: a validated program becomes a small stack-machine code array.

The code is produced by our own code generator from the validated AST and is interpreted
by `run_code`, a numba-compiled loop. One interpreter is compiled once for every program,
so a new program costs no JIT time and no program text is ever executed. The operators'
opcodes and semantics (shared with the numexpr and Go back ends) are the table in
`operators.py`; this module adds the instructions that are not operators (loads, stores,
return) and `run_code`'s branch for each opcode.
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass

import numpy as np
from numba import njit

from stepml_evolve.evaluator.dsl.operators import (
    AND,
    EXP_CLAMP,
    OPERATORS,
    Kind,
    Operator,
    literal_number,
    operands,
    operator_of,
)
from stepml_evolve.evaluator.dsl.program import FUNCTIONS, REQUEST_FIELDS, Program, ProgramError
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX

# run_code compares against the members of this IntEnum: numba freezes them as constants
Opcode = enum.unique(
    enum.IntEnum(
        "Opcode",
        {
            "LIT": 0,
            "COMP": 1,
            "CONST": 2,
            "REQ": 3,
            "LOAD": 4,
            "STORE": 5,
            "RET": 29,
            **{op.vm: op.opcode for op in OPERATORS if op.vm is not None},
        },
    )
)

STACK_SIZE = 64
LOCALS_SIZE = 40
FUNCTION_SLOTS = list(FUNCTIONS)  # entry order: step_time, queueing_time, output_token_time, post_decode_time


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
                self.emit(Opcode.STORE, slots[name], pops=1)
            elif isinstance(stmt, ast.Return):
                self.expr(stmt.value, slots)
                self.emit(Opcode.RET, 0, pops=1)

    def expr(self, node: ast.AST, slots: dict[str, int]) -> None:
        op = operator_of(node)
        if isinstance(node, ast.Constant):
            self.emit(Opcode.LIT, self.lit(node.value), pushes=1)
        elif isinstance(node, ast.Attribute):
            base = node.value.id
            if base == "f":
                self.emit(Opcode.COMP, COMPONENT_INDEX[node.attr], pushes=1)
            elif base == "c":
                self.emit(Opcode.CONST, self.consts[node.attr], pushes=1)
            else:
                self.emit(Opcode.REQ, REQUEST_FIELDS.index(node.attr), pushes=1)
        elif isinstance(node, ast.Name):
            self.emit(Opcode.LOAD, slots[node.id], pushes=1)
        elif op is None or op.kind.in_condition:  # the validator admits nothing else
            raise TypeError(f"cannot compile {type(node).__name__}")
        elif op.exponent:  # the literal exponent is the instruction's argument
            self.expr(node.left, slots)
            self.emit(op.opcode, self.lit(literal_number(node.right)), pops=1, pushes=1)
        elif op.kind is Kind.IF_ELSE:  # both branches, then the test; the instruction picks one
            self.expr(node.body, slots)
            self.expr(node.orelse, slots)
            self.cond(node.test, slots)
            self.emit(op.opcode, pops=3, pushes=1)
        else:
            self.fold(op, operands(node), self.expr, slots)

    def cond(self, node: ast.AST, slots: dict[str, int]) -> None:
        if isinstance(node, ast.Compare):  # a < b < c: (a < b) and (b < c)
            values = operands(node)
            for i, cmp in enumerate(node.ops):
                self.fold(operator_of(cmp), values[i : i + 2], self.expr, slots)
                if i:
                    self.emit(AND.opcode, pops=2, pushes=1)
        else:  # and, or, not
            self.fold(operator_of(node), operands(node), self.cond, slots)

    def fold(self, op: Operator, args: list[ast.AST], visit, slots: dict[str, int]) -> None:
        """A one-operand instruction after its operand; a two-operand one after each operand past
        the first, folding left: max(a, b, c) is a, b, MAX, c, MAX."""
        visit(args[0], slots)
        if len(args) == 1 and op.opcode is not None:  # unary plus compiles to nothing
            self.emit(op.opcode, pops=1, pushes=1)
        for a in args[1:]:
            visit(a, slots)
            self.emit(op.opcode, pops=2, pushes=1)


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
        if op == Opcode.COMP:
            stack[sp] = comps[arg]
            sp += 1
        elif op == Opcode.CONST:
            stack[sp] = consts[arg]
            sp += 1
        elif op == Opcode.LIT:
            stack[sp] = lits[arg]
            sp += 1
        elif op == Opcode.MUL:
            sp -= 1
            stack[sp - 1] = stack[sp - 1] * stack[sp]
        elif op == Opcode.ADD:
            sp -= 1
            stack[sp - 1] = stack[sp - 1] + stack[sp]
        elif op == Opcode.LOAD:
            stack[sp] = local[arg]
            sp += 1
        elif op == Opcode.STORE:
            sp -= 1
            local[arg] = stack[sp]
        elif op == Opcode.MAX:
            sp -= 1
            if stack[sp] > stack[sp - 1]:
                stack[sp - 1] = stack[sp]
        elif op == Opcode.MIN:
            sp -= 1
            if stack[sp] < stack[sp - 1]:
                stack[sp - 1] = stack[sp]
        elif op == Opcode.SUB:
            sp -= 1
            stack[sp - 1] = stack[sp - 1] - stack[sp]
        elif op == Opcode.DIV:
            sp -= 1
            b = stack[sp]
            stack[sp - 1] = stack[sp - 1] / b if b != 0.0 else 0.0
        elif op == Opcode.NEG:
            stack[sp - 1] = -stack[sp - 1]
        elif op == Opcode.RET:
            return stack[sp - 1]
        elif op == Opcode.POWI:
            stack[sp - 1] = stack[sp - 1] ** lits[arg]
        elif op == Opcode.POWF:
            stack[sp - 1] = abs(stack[sp - 1]) ** lits[arg]
        elif op == Opcode.ABS:
            stack[sp - 1] = abs(stack[sp - 1])
        elif op == Opcode.SQRT:
            stack[sp - 1] = np.sqrt(abs(stack[sp - 1]))
        elif op == Opcode.LOG:
            x = abs(stack[sp - 1])
            stack[sp - 1] = np.log(x) if x > 0.0 else 0.0
        elif op == Opcode.EXP:
            x = stack[sp - 1]
            stack[sp - 1] = np.exp(x if x < EXP_CLAMP else EXP_CLAMP)
        elif op == Opcode.REQ:
            stack[sp] = req[arg]
            sp += 1
        elif op == Opcode.SELECT:
            sp -= 2
            if stack[sp + 1] == 0.0:
                stack[sp - 1] = stack[sp]
        elif op == Opcode.LT:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] < stack[sp] else 0.0
        elif op == Opcode.LE:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] <= stack[sp] else 0.0
        elif op == Opcode.GT:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] > stack[sp] else 0.0
        elif op == Opcode.GE:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] >= stack[sp] else 0.0
        elif op == Opcode.EQ:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] == stack[sp] else 0.0
        elif op == Opcode.NE:
            sp -= 1
            stack[sp - 1] = 1.0 if stack[sp - 1] != stack[sp] else 0.0
        elif op == Opcode.AND:
            sp -= 1
            stack[sp - 1] = 1.0 if (stack[sp - 1] != 0.0 and stack[sp] != 0.0) else 0.0
        elif op == Opcode.OR:
            sp -= 1
            stack[sp - 1] = 1.0 if (stack[sp - 1] != 0.0 or stack[sp] != 0.0) else 0.0
        elif op == Opcode.NOT:
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
        return float(
            run_code(
                self.c.code,
                self.c.literals,
                pc,
                np.asarray(comps, dtype=np.float64),
                np.asarray(consts, dtype=np.float64),
                np.asarray(req, dtype=np.float64),
                self._stack,
                self._local,
            )
        )

    def step_time(self, comps, consts) -> float:
        return self._run("step_time", comps, consts, self._empty)

    def queueing_time(self, input_tokens, output_tokens, consts, last_step_us: float = 0.0) -> float:
        return self._run(
            "queueing_time",
            self._empty,
            consts,
            np.array([input_tokens, output_tokens, last_step_us], dtype=np.float64),
        )

    def output_token_time(self, consts) -> float:
        return self._run("output_token_time", self._empty, consts, self._empty)

    def post_decode_time(self, consts) -> float:
        return self._run("post_decode_time", self._empty, consts, self._empty)
