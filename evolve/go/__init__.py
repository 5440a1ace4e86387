"""Go output: a program as a gofmt-clean Go file implementing BLIS's `sim.LatencyModel` (source.py,
from templates/), the analytical components translated to Go (components.py), Go literals and names
(text.py), and the Go test that holds Go's predictions to Python's (parity.py).

What callers use (imported on first use): go_source (Go source of a program), go_test_source,
gofmt, find_go_tool, EmitError (a construct Go cannot express, or no gofmt), TARGETS (the BLIS
interfaces), DEFAULT_TARGET, DEFAULT_NAME, DEFAULT_SAMPLES (batches in the parity test).
"""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".source": (
            "go_source",
            "go_test_source",
            "gofmt",
            "find_go_tool",
            "EmitError",
            "TARGETS",
            "DEFAULT_TARGET",
            "DEFAULT_NAME",
        ),
        ".parity": ("DEFAULT_SAMPLES",),
    },
)
