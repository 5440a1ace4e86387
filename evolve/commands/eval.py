"""`evolve eval`: a program file replayed closed-loop on every experiment, scored on one split."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.data.prompt_reuse import DEFAULT_POLICY
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.physics.floor import FloorCheck, check_floor, envelope_for
from stepml_evolve.evaluator.physics.rules import physics_problems
from stepml_evolve.evaluator.say import Say, quiet
from stepml_evolve.evaluator.scoring.metrics import MetricRow
from stepml_evolve.evaluator.scoring.objectives import DEFAULT, Objective

from .evaluation_setup import EvaluationSetup


class EvaluationError(UserError):
    """A program that replays on none of the experiments: one line, not one per experiment."""


@dataclass
class Evaluation:
    program: Path
    data: LoadedData
    split: str
    rows: list[MetricRow]  # one per experiment; a failed replay's row carries its `error`
    objective: Objective = DEFAULT
    prompt_reuse: str = DEFAULT_POLICY
    floor: FloorCheck | None = None  # the program at its constants against the physical floor
    physics: list[tuple[str, str]] = field(default_factory=list)  # (rule, message) of the rules it breaks

    @property
    def loss(self) -> float:
        return self.objective.of_rows(self.rows)

    @property
    def failed(self) -> list[MetricRow]:
        return [r for r in self.rows if r.error]

    def failed_everywhere(self, skip_bad: bool = False) -> EvaluationError | None:
        """One error for a program that fails to replay on every experiment (the reason on the
        first; the experiments that did not load as its details, unless skip_bad), else None."""
        if not self.rows or len(self.failed) < len(self.rows):
            return None
        first = self.rows[0]
        error = EvaluationError(
            f"{self.program}: fails to replay on every experiment ({len(self.rows)}); on {first.name}: {first.error}"
        )
        error.details = () if skip_bad else tuple(str(e) for e in self.data.errors)
        return error

    def to_json(self) -> dict:
        return {
            "program": str(self.program),
            "data": self.data.label,
            "synthetic": self.data.synthetic,
            "split": self.split,
            "prompt_reuse": self.prompt_reuse,
            "loss": self.loss,
            **self.objective.settings(),
            "floor": self.floor.to_json() if self.floor else None,
            "physics": [{"rule": rule, "problem": message} for rule, message in self.physics],
            "experiments": self.rows,
            "errors": [{"name": e.experiment, "error": e.problem} for e in self.data.errors],
        }


def evaluate_program(
    path: Path, setup: EvaluationSetup = EvaluationSetup(), split: str = "test", say: Say = quiet
) -> Evaluation:
    """The program's per-experiment metrics on `split`, with the constants it holds, and how it
    stands against the physics `--physics check` asks of a program (reported, not enforced: eval
    fits nothing). Experiments that do not load are in `data.errors` (the caller reports the good
    ones, then `setup.refuse_bad`)."""
    program = load_program(path)
    loaded = setup.load(say, keep_bad=True)
    goal = setup.goal(loaded)
    vectors = [np.array(list(program.constants.values()), dtype=float) for _ in loaded.experiments]
    with setup.replay_pool(loaded) as pool:
        rows = pool.score(program, vectors, (split,), percentiles=True)[split]
    env = envelope_for(loaded.experiments)
    return Evaluation(
        path,
        loaded,
        split,
        rows,
        goal,
        setup.prompt_reuse,
        check_floor(program, env=env),
        physics_problems(program, env),
    )
