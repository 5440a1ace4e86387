"""The program DSL: the operator table (operators.py), parse/validate (program.py), units
(units.py), scalar VM (vm.py), numexpr (numexpr_compile.py).

Each name is imported from its module on first use: parsing (program.py) never loads numexpr or
the VM."""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".program": (
            "FUNCTIONS",
            "REQUEST_FIELDS",
            "Program",
            "ProgramError",
            "load_program",
            "read_program_text",
            "parse_program",
        ),
        ".vm": ("CompiledProgram", "ScalarProgram", "compile_program"),
        ".numexpr_compile": ("compile_vector", "evaluate_vector", "step_times"),
        ".units": ("Unit", "UnitReport", "check_units", "infer_units"),
    },
)
