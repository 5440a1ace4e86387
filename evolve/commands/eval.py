"""`evolve eval`: a program file replayed closed-loop on every experiment, scored on one split."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.engine import Engine
from stepml_evolve.evaluator.metrics import MetricRow
from stepml_evolve.evaluator.objectives import DEFAULT, Objective, load_objective
from stepml_evolve.evaluator.prompt_reuse import DEFAULT_POLICY
from stepml_evolve.evaluator.replay import DEFAULT_SEMANTICS

from stepml_evolve.evolve.cli.console import Log
from .inputs import load_usable


@dataclass
class Evaluation:
    program: Path
    data: LoadedData
    split: str
    rows: list[MetricRow]  # one per experiment; a failed replay's row carries its `error`
    objective: Objective = DEFAULT
    prompt_reuse: str = DEFAULT_POLICY

    @property
    def loss(self) -> float:
        return self.objective.of_rows(self.rows)

    @property
    def failed(self) -> list[MetricRow]:
        return [r for r in self.rows if r.error]

    def to_json(self) -> dict:
        return {"program": str(self.program), "data": self.data.label, "synthetic": self.data.synthetic,
                "split": self.split, "prompt_reuse": self.prompt_reuse, "loss": self.loss, **self.objective.settings(), "experiments": self.rows}


def evaluate_program(path: Path, data: Path | None = None, split: str = "test", workers: int | None = None,
                     output_len: str = "profile", log: Log | None = None,
                     semantics: str = DEFAULT_SEMANTICS, objective: str = "rms",
                     weights: Path | None = None, prompt_reuse: str = DEFAULT_POLICY) -> Evaluation:
    """The program's per-experiment metrics on `split`, with the constants it holds."""
    program = load_program(path)
    loaded = load_usable(data, output_len, log or Log(), prompt_reuse)
    goal = load_objective(objective, weights, [e.name for e in loaded.experiments])
    vectors = [np.array(list(program.constants.values()), dtype=float) for _ in loaded.experiments]
    with Engine(loaded.experiments, workers, semantics=semantics) as engine:
        rows = engine.score(program, vectors, (split,), percentiles=True)[split]
    return Evaluation(path, loaded, split, rows, goal, prompt_reuse)
