"""The program DSL: the operator table (operators.py), parse/validate (program.py), units
(units.py), scalar VM (vm.py), numexpr (numexpr_compile.py)."""

from stepml_evolve.evaluator.dsl.numexpr_compile import compile_vector, evaluate_vector, step_times
from stepml_evolve.evaluator.dsl.program import (
    FUNCTIONS,
    REQUEST_FIELDS,
    Program,
    ProgramError,
    load_program,
    parse_program,
    read_program_text,
)
from stepml_evolve.evaluator.dsl.units import Unit, UnitReport, check_units, infer_units
from stepml_evolve.evaluator.dsl.vm import CompiledProgram, ScalarProgram, compile_program

__all__ = [
    "FUNCTIONS",
    "REQUEST_FIELDS",
    "Program",
    "ProgramError",
    "load_program",
    "read_program_text",
    "parse_program",
    "CompiledProgram",
    "ScalarProgram",
    "compile_program",
    "compile_vector",
    "evaluate_vector",
    "step_times",
    "Unit",
    "UnitReport",
    "check_units",
    "infer_units",
]
