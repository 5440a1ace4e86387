"""What a fit minimizes and a search ranks by: a loss over per-experiment errors of the means.

  rms     RMS over experiments of APE(mean E2E) + RMS of APE(mean TTFT), in percent (the loss
          every figure of this project uses);
  worst3  mean of the three largest per-experiment APE(mean E2E) (the research protocol's
          "no experiment left behind" criterion; fewer experiments: the mean of those there).

Per-experiment weights (`--weights FILE`, YAML: experiment-name pattern -> weight, the first
pattern that matches wins, unmatched experiments weigh 1) turn the RMS into a weighted RMS and
scale each experiment's APE before worst3 ranks them. Experiments with no measured request
(NaN APE) carry no information and are skipped; a failed replay (infinite APE) makes the loss
infinite.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stepml_evolve.evaluator.errors import UserError, shown
from stepml_evolve.evaluator.readers import read_yaml

if TYPE_CHECKING:  # metrics.py loads the replay; the objectives' names and defaults must not
    from stepml_evolve.evaluator.scoring.metrics import MetricRow

OBJECTIVES = ("rms", "worst3")


class ObjectiveError(UserError, ValueError):
    """A bad objective name or weights file: one line naming it."""


@dataclass(frozen=True)
class Objective:
    name: str = "rms"
    weights: tuple[tuple[str, float], ...] = ()  # (experiment-name pattern, weight), first match wins

    def __post_init__(self):
        if self.name not in OBJECTIVES:
            raise ObjectiveError(f"objective must be one of {', '.join(OBJECTIVES)}, not {self.name!r}")

    def weight(self, experiment: str) -> float:
        for pattern, w in self.weights:
            if fnmatch.fnmatchcase(experiment, pattern):
                return w
        return 1.0

    def describe(self) -> str:
        what = {"rms": "RMS APE mean E2E + RMS APE mean TTFT, %", "worst3": "mean of the 3 worst APE mean E2E, %"}[
            self.name
        ]
        return what + (f"; weights {', '.join(f'{p}={w:g}' for p, w in self.weights)}" if self.weights else "")

    def settings(self) -> dict:
        """As stored with a run's settings."""
        return {"objective": self.name, "weights": [list(p) for p in self.weights] or None}

    def of_apes(self, names: list[str], e2e: np.ndarray, ttft: np.ndarray) -> np.ndarray:
        """Loss of each row of (P, E) APE arrays over experiments `names` -> (P,)."""
        e2e, ttft = np.atleast_2d(np.asarray(e2e, float)), np.atleast_2d(np.asarray(ttft, float))
        w = np.array([self.weight(n) for n in names], dtype=float)
        if self.name == "worst3":
            return np.array([_worst(row * w, 3) for row in e2e])
        if not self.weights:  # the plain RMS, as every figure before objectives existed
            from stepml_evolve.evaluator.scoring.metrics import rms

            return np.array([rms(a) + rms(b) for a, b in zip(e2e, ttft)])
        return np.array([_weighted_rms(a, w) + _weighted_rms(b, w) for a, b in zip(e2e, ttft)])

    def of_rows(self, rows: list[MetricRow]) -> float:
        """The loss of metric rows (one per experiment); NaN when none measures a request."""
        rows = [r for r in rows if r.n_requests > 0]
        if not rows:
            return math.nan
        e2e = [_float(r.ape.e2e) for r in rows]
        ttft = [_float(r.ape.ttft) for r in rows]
        return float(self.of_apes([r.name for r in rows], np.array([e2e]), np.array([ttft]))[0])


def _float(x) -> float:
    return math.nan if x is None else float(x)


def _worst(values: np.ndarray, k: int) -> float:
    v = values[~np.isnan(values)]
    if len(v) == 0:
        return math.nan
    return float(np.mean(np.sort(v)[-k:]))


def _weighted_rms(values: np.ndarray, w: np.ndarray) -> float:
    keep = ~np.isnan(values)
    if not keep.any():
        return math.nan
    v, w = values[keep], w[keep]
    return float(np.sqrt(np.sum(w * v * v) / np.sum(w)))


def _positive_number(w) -> bool:
    """A finite positive int or float (not a bool; an int too large for a float is not finite)."""
    if not isinstance(w, (int, float)) or isinstance(w, bool):
        return False
    try:
        w = float(w)
    except OverflowError:
        return False
    return math.isfinite(w) and w > 0


def load_objective(
    name: str = "rms", weights_file: str | Path | None = None, experiments: list[str] | None = None
) -> Objective:
    """The objective `name` with the weights of a YAML file (pattern -> positive weight); with
    `experiments`, a pattern matching none of them is refused (a typo would silently weigh 1)."""
    if weights_file is None:
        return Objective(name)
    path = Path(weights_file)
    data = read_yaml(path, ObjectiveError, "weights file")
    if not isinstance(data, dict) or not data:
        raise ObjectiveError(f"{path}: expected a mapping of experiment-name pattern -> weight")
    weights = []
    for pattern, w in data.items():
        if not _positive_number(w):
            raise ObjectiveError(f"{path}: weight of {shown(pattern)} must be a positive number, not {shown(w)}")
        if experiments is not None and not any(fnmatch.fnmatchcase(e, str(pattern)) for e in experiments):
            raise ObjectiveError(f"{path}: pattern {shown(pattern)} matches no experiment")
        weights.append((str(pattern), float(w)))
    return Objective(name, tuple(weights))


DEFAULT = Objective()
