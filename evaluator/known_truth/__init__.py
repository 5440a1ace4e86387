"""Known-truth worlds (issue 26): hidden step-time laws (the worlds/ folder), the grid of
configurations they are measured on, and the held-out splits that test extrapolation.

`evolve data synth --world NAME --out DIR` writes one world (generate.write_world); `evolve data
worlds` lists them. The laws are data the search never reads.

The grid (configurations.py, light) is imported here; the rest on first use, so that the command
line offers the grids' names without loading the replay. (`configurations` is both a module and
its function: the function is bound here, before any import of the module could bind the module.)
"""

from stepml_evolve.evaluator.known_truth.configurations import GRID_SIZES, GRIDS, Configuration, configurations
from stepml_evolve.lazy import attach

__getattr__, _dir, _lazy = attach(
    __name__,
    {
        ".generate": ("generate_world", "write_world"),
        ".laws": ("World", "WorldError", "load_world", "world_names"),
        ".splits": ("SPLITS", "make_inner_splits", "make_splits"),
        ".workloads": ("WORKLOADS",),
    },
)
__all__ = ["GRID_SIZES", "GRIDS", "Configuration", "configurations", *_lazy]


def __dir__() -> list[str]:
    return sorted({*__all__, *_dir()})
