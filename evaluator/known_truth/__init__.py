"""Known-truth worlds (issue 26): hidden step-time laws (the worlds/ folder), the grid of
configurations they are measured on, and the held-out splits that test extrapolation.

`evolve data synth --world NAME --out DIR` writes one world (generate.write_world); `evolve data
worlds` lists them. The laws are data the search never reads.
"""

from stepml_evolve.evaluator.known_truth.configurations import GRID_SIZES, GRIDS, Configuration, configurations
from stepml_evolve.evaluator.known_truth.generate import generate_world, write_world
from stepml_evolve.evaluator.known_truth.laws import World, WorldError, load_world, world_names
from stepml_evolve.evaluator.known_truth.splits import SPLITS, make_inner_splits, make_splits
from stepml_evolve.evaluator.known_truth.workloads import WORKLOADS

__all__ = [
    "GRID_SIZES",
    "GRIDS",
    "SPLITS",
    "WORKLOADS",
    "Configuration",
    "World",
    "WorldError",
    "configurations",
    "generate_world",
    "load_world",
    "make_inner_splits",
    "make_splits",
    "world_names",
    "write_world",
]
