"""`evolve fit`: a program file's constants fitted on the train split, scored on validate and
test, and written as fitted program files (one per fit group) with their `# fitted:` header."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.evaluator.choices import PHYSICS_MODES
from stepml_evolve.evaluator.data.prompt_reuse import DEFAULT_POLICY
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fit.fitted_header import FittedHeader
from stepml_evolve.evaluator.fit.fitting import (
    FAILED_LOSS,
    FAILED_REASON,
    FitConfig,
    FitResult,
    group_key,
    quick_config,
)
from stepml_evolve.evaluator.fit.identifiability import ConstantReport, identify
from stepml_evolve.evaluator.fit.starts import fit_from_starts
from stepml_evolve.evaluator.outputs import check_outputs, per_group_paths, write_atomic
from stepml_evolve.evaluator.physics.floor import FloorCheck, check_floor, envelope_for
from stepml_evolve.evaluator.physics.rules import physics_problems
from stepml_evolve.evaluator.say import Say, quiet
from stepml_evolve.evaluator.scoring.metrics import MetricRow

from .evaluation_setup import EvaluationSetup, FitProgress, no_progress

SCORED_SPLITS = ("validate", "test")


class FitError(UserError):
    """A program that no constants make evaluable: nothing is written."""


@dataclass
class FittedPrograms:
    program: Path
    data: LoadedData
    config: FitConfig
    result: FitResult
    written: list[Path]
    rows: dict[str, list[MetricRow]]  # SCORED_SPLITS -> one row per experiment
    prompt_reuse: str = DEFAULT_POLICY
    physics: str = PHYSICS_MODES[0]
    # group -> each constant's identifiability at the group's fitted constants (empty: not profiled)
    identifiability: dict[str, list[ConstantReport]] = dataclasses.field(default_factory=dict)
    floor: dict[str, FloorCheck] = dataclasses.field(default_factory=dict)  # group -> the fitted program's floor check
    starts: list[FitResult] = dataclasses.field(
        default_factory=list
    )  # every start's fit (--starts), the kept one among them

    @property
    def losses(self) -> dict[str, float]:
        return {s: self.config.objective.of_rows(rows) for s, rows in self.rows.items()}

    def to_json(self) -> dict:
        return {
            "program": str(self.program),
            "fitted_programs": [str(p) for p in self.written],
            "data": self.data.label,
            "synthetic": self.data.synthetic,
            "prompt_reuse": self.prompt_reuse,
            "seed": self.config.seed,
            "scope": self.config.scope,
            "method": self.config.method,
            **self.config.objective.settings(),
            "physics": self.physics,
            "train_loss": self.result.loss,
            "prior_penalty": self.result.penalties,
            "constants": self.result.constants,
            "floor": {g: c.to_json() for g, c in self.floor.items()},
            "identifiability": {g: [r.to_json() for r in rs] for g, rs in self.identifiability.items()},
            "evaluations": self.result.evaluations,
            "starts": [{"loss": r.loss, "penalty": sum(r.penalties.values()), "start": r.start} for r in self.starts],
            "seconds": self.result.seconds,
            "splits": {s: {"loss": self.losses[s], "experiments": rows} for s, rows in self.rows.items()},
        }


def fit_program(
    path: Path,
    setup: EvaluationSetup = EvaluationSetup(),
    *,
    seed: int = FitConfig.seed,
    scope: str = FitConfig.scope,
    out: Path | None = None,
    max_evals: int | None = FitConfig.max_evals,
    quick: bool = False,
    restarts: int = FitConfig.restarts,
    starts: int = 1,
    method: str = FitConfig.method,
    physics: str = PHYSICS_MODES[0],
    profile: bool = True,
    say: Say = quiet,
    progress: FitProgress = no_progress,
) -> FittedPrograms:
    """Fit, score and write; `out` (default <program>.fitted.py here) gets a .<group> infix per group
    when the scope makes several. Output paths are checked before the fit starts. physics "check":
    a program that breaks a rule of evaluator/physics/rules.py (below the floor, a non-causal input,
    ...) is refused before any fit, and the fit keeps it at or above the floor; "off": neither.
    profile: each group's constants profiled after the fit (evaluator/fit/identifiability.py).
    starts: fits from the program's constants and from draws from their priors, the best kept
    (evaluator/fit/starts.py)."""
    program = load_program(path)
    loaded = setup.load(say)
    goal = setup.goal(loaded)
    if physics not in PHYSICS_MODES:
        raise FitError(f"--physics must be one of {', '.join(PHYSICS_MODES)}, not {physics!r}")
    env = envelope_for(loaded.experiments)
    if physics == "check" and (problems := physics_problems(program, env)):
        rule, message = problems[0]
        raise FitError(f"{path}: {message} [{rule}]; nothing fitted (--physics off fits it anyway)")
    config = quick_config(seed, loaded.experiments, method) if quick else FitConfig(seed=seed, scope=scope)
    config = dataclasses.replace(
        config,
        scope=scope,
        max_evals=max_evals or config.max_evals,
        restarts=restarts,
        method=method,
        objective=goal,
        floor=physics == "check",
    )
    base = out or Path(f"{path.stem}.fitted.py")
    paths = per_group_paths(base, sorted({group_key(e, scope) for e in loaded.experiments}))
    check_outputs(list(paths.values()), inputs=[path])
    with setup.replay_pool(loaded, floor=physics == "check") as pool, progress() as on_progress:
        result, every = fit_from_starts(
            program, loaded.experiments, pool, config, dict(program.constants), starts, progress=on_progress
        )
        if not result.loss < FAILED_LOSS:
            raise FitError(f"{path}: {FAILED_REASON}; nothing written")
        vectors = [result.vector_for(program, e) for e in loaded.experiments]
        rows = pool.score(program, vectors, SCORED_SPLITS, percentiles=True)
        profiles, floors = {}, {}
        for group, names in result.groups.items():
            consts = result.constants[group]
            floors[group] = check_floor(program, consts, env)
            if profile:
                gexps = [e for e in loaded.experiments if e.name in names]
                profiles[group] = identify(program, consts, gexps, pool, config)
    written = []
    for group, constants in result.constants.items():
        header = FittedHeader(
            data=loaded.label,
            seed=seed,
            scope=scope,
            group=group,
            restarts=restarts,
            quick=quick,
            semantics=setup.semantics,
            method=method,
            objective=goal.name + ("+weights" if goal.weights else ""),
            prompt_reuse=setup.prompt_reuse,
            train_loss=result.loss,
            loss_of_all_groups=len(result.constants) != 1,
            evaluations=result.evaluations,
        )
        target = paths.get(group, base)
        write_atomic(target, program.with_constants(constants, header=header.render()).source)
        written.append(target)
    return FittedPrograms(
        path, loaded, config, result, written, rows, setup.prompt_reuse, physics, profiles, floors, every
    )
