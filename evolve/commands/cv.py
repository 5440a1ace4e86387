"""`evolve cv`: a program file cross-validated by a protocol (lomo, lowo, groups:FILE): per fold,
its constants fitted on the other experiments and the held-out experiments scored on all requests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.evaluator.choices import PHYSICS_MODES
from stepml_evolve.evaluator.data.prompt_reuse import DEFAULT_POLICY
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fit.crossval import CrossValidation, cross_validate, make_folds, summarize
from stepml_evolve.evaluator.fit.fitting import FitConfig
from stepml_evolve.evaluator.physics.floor import envelope_for
from stepml_evolve.evaluator.physics.rules import physics_problems
from stepml_evolve.evaluator.say import Say, quiet

from .evaluation_setup import EvaluationSetup, FitProgress, no_progress


@dataclass
class CrossValidatedProgram:
    program: Path
    data: LoadedData
    config: FitConfig
    cv: CrossValidation
    prompt_reuse: str = DEFAULT_POLICY

    def to_json(self) -> dict:
        return {
            "program": str(self.program),
            "protocol": self.cv.protocol,
            "data": self.data.label,
            "synthetic": self.data.synthetic,
            "prompt_reuse": self.prompt_reuse,
            "seed": self.config.seed,
            "method": self.config.method,
            **self.config.objective.settings(),
            "folds": [
                {
                    "name": f.fold.name,
                    "train": list(f.fold.train),
                    "train_loss": f.fit.loss,
                    "evaluations": f.fit.evaluations,
                    "constants": f.constants,
                    "experiments": f.rows,
                }
                for f in self.cv.folds
            ],
            "summary": self.cv.summary(),
            "loss": self.cv.loss,
            **({"starts": self.starts()} if self.cv.start_losses else {}),
            **({"in_distribution": self.in_distribution()} if self.cv.in_distribution else {}),
        }

    def starts(self) -> list[dict]:
        """Each start's CV loss and fold fits (start 0 from the program's constants)."""
        return [
            {
                "loss": loss,
                "summary": summarize([r for f in self.cv.folds for r in f.starts[k][1]]),
                "train_losses": [f.starts[k][0].loss for f in self.cv.folds],
                "kept_by": [f.fold.name for f in self.cv.folds if f.starts[k][0] is f.fit],
            }
            for k, loss in enumerate(self.cv.start_losses)
        ]

    def in_distribution(self) -> dict:
        inside = self.cv.in_distribution
        return {
            "train_loss": inside.fit.loss,
            "evaluations": inside.fit.evaluations,
            "constants": inside.constants,
            "experiments": inside.rows,
            "summary": summarize(inside.rows),
            "loss": self.config.objective.of_rows(inside.rows),
        }


def cross_validate_program(
    path: Path,
    protocol: str,
    setup: EvaluationSetup = EvaluationSetup(),
    *,
    seed: int = FitConfig.seed,
    max_evals: int | None = FitConfig.max_evals,
    method: str = FitConfig.method,
    in_distribution: bool = False,
    starts: int = 1,
    physics: str = PHYSICS_MODES[0],
    say: Say = quiet,
    progress: FitProgress = no_progress,
) -> CrossValidatedProgram:
    """Folds are made (and a bad protocol or groups file refused) before any fit starts; with
    physics "check" a program that breaks a rule of evaluator/physics/rules.py is refused too, and the
    fold fits keep it at or above the floor. `starts`: each fold fitted from several starts, its best
    train fit kept (evaluator/fit/crossval.py)."""
    program = load_program(path)
    loaded = setup.load(say)
    folds = make_folds(protocol, loaded.experiments)
    if physics == "check" and (problems := physics_problems(program, envelope_for(loaded.experiments))):
        rule, message = problems[0]
        raise UserError(f"{path}: {message} [{rule}]; nothing fitted (--physics off cross-validates it anyway)")
    config = dataclasses.replace(
        FitConfig(seed=seed, max_evals=max_evals, method=method, floor=physics == "check"), objective=setup.goal(loaded)
    )
    with setup.replay_pool(loaded, floor=physics == "check") as pool, progress() as on_progress:
        cv = cross_validate(
            program,
            loaded.experiments,
            pool,
            protocol,
            folds,
            config,
            progress=on_progress,
            percentiles=True,
            in_distribution=in_distribution,
            starts=starts,
        )
    return CrossValidatedProgram(path, loaded, config, cv, setup.prompt_reuse)
