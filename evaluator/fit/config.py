"""What a fit is asked (`FitConfig`, the budget of a screening fit) and what it reports its
progress through: the settings fitting.py acts on, apart from it so that reading them (the command
line's defaults, a search's settings) loads neither pycma nor the replay."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepml_evolve.evaluator.choices import METHODS, SCOPES
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.scoring.objectives import DEFAULT, Objective

ProgressFn = Callable[[str, int, float, int, float], None]  # group, iteration, best loss, evals, evals/s


class FitConfigError(UserError, ValueError):
    """A fit setting out of its range: one line naming it."""


@dataclass(frozen=True)
class FitConfig:
    scope: str = "global"
    seed: int = 0
    max_evals: int | None = None  # per group; default grows with the number of constants
    sigma0: float = 0.5  # initial step (log space: 0.5 ~ a factor of 1.65)
    popsize: int | None = None
    tolfun: float = 1e-3  # stop when the loss (in % points) moves less than this
    split: str = "train"
    window: float | None = None  # score only the first fraction of requests
    experiments: tuple[str, ...] | None = None  # restrict to these experiment names
    restarts: int = 0  # extra runs from the best point so far (a fresh trust region, or a fresh CMA-ES)
    method: str = "trust-region"
    objective: Objective = DEFAULT
    surrogate_evals: int | None = None  # surrogate evaluations per trust-region iteration (default by size)
    candidates: int = 3  # closed-loop judged points per trust-region iteration (the surrogate's optimum and neighbours)
    # the trust region stops after this many judged points without a gain of at least tolfun (a
    # surrogate that sees no gain counts as an iteration's candidates): five iterations of three
    stall_points: int = 15
    # the trust region's surrogate step solves the constants the program is affine in by least
    # squares and samples only the others (linear_solve.py; objective "rms" only). For fits near
    # a good point (the search's screening and promoted fits); from a program's own constants in
    # the standard box, the surrogate's exact optimum often overshoots (docs/HISTORY.md)
    linear_solve: bool = False
    # constants that put step_time below the physical floor anywhere in the envelope (floor.py) are
    # infeasible; False for a program that is no physics (a regression such as BLIS's blackbox)
    floor: bool = True

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise FitConfigError(f"scope must be one of {', '.join(SCOPES)}, not {self.scope!r}")
        if self.method not in METHODS:
            raise FitConfigError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")


QUICK_EVALS = {"trust-region": 6, "cmaes": 40}  # closed-loop evaluations of a screening fit
QUICK_WINDOW = 0.3  # the share of each screening experiment's requests a screening fit replays
