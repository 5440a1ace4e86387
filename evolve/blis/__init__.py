"""BLIS, the simulator the programs are for: install an emitted model into a BLIS checkout and
run its Go checks there (install.py, `evolve emit-go --blis`), and replay experiments in BLIS and
in the tool to compare them request by request (compare.py, `evolve blis-compare`).

What callers use (imported on first use): install_into_blis, BlisError, DEFAULT_BACKEND,
DEFAULT_GO_TEST, compare_program_in_blis, compare_with_blis.
"""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".install": ("install_into_blis", "BlisError", "DEFAULT_BACKEND", "DEFAULT_GO_TEST"),
        ".compare": ("compare_program_in_blis", "compare_with_blis"),
    },
)
