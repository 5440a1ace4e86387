"""The Python API (for notebooks): an archive's programs, evaluations, CV scores and generations
as pandas DataFrames, and a program scored, fitted or emitted as Go, in a few calls.

    runs = open_archive("runs/synthetic-seed7")  # read-only; None: the newest archive under runs/
    runs.programs[runs.programs.front]           # the Pareto front (as PySR's model.equations_)
    text = runs.program("best")                  # DSL text with its fitted constants
    score(text)                                  # per-experiment metrics, .attrs["loss"]
    fitted = fit(text, seed=0, max_evals=8)      # .program, .losses, .metrics
    emit_go(text, "stepml_evolved.go")           # the Go model

Each call is the library function behind its command (evolve.browse for `evolve archive`,
evolve.commands for `eval`, `fit` and `emit-go`), so it gives what the command gives; a program
is a file path or its text (anything holding a newline), which is validated, then handled as a
file in a temporary directory. Bad input raises the command's one-line `UserError`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from stepml_evolve.archive.access import latest_archive_dir, opened, run_programs
from stepml_evolve.evaluator.data.experiments import SCORED_SPLITS
from stepml_evolve.evaluator.dsl import parse_program
from stepml_evolve.evaluator.errors import UserError, cut, shown
from stepml_evolve.evaluator.fit.fitting import FitConfig
from stepml_evolve.evolve.browse.listing import show_source
from stepml_evolve.evolve.commands.eval import evaluate_program
from stepml_evolve.evolve.commands.evaluation_setup import EvaluationSetup
from stepml_evolve.evolve.commands.fit import fit_program
from stepml_evolve.evolve.deploy.scores import cv_by_program
from stepml_evolve.evolve.go.emission import emit_program, emitted_sources
from stepml_evolve.evolve.go.source import DEFAULT_NAME, DEFAULT_TARGET

from .frames import cv_score_frame, evaluation_frame, generation_frame, metric_frame, program_frame

PathSpec = str | os.PathLike
ProgramSpec = PathSpec  # a program file's path, or the program's text (a str holding a newline)


class ArchiveView:
    """The latest run of a search archive, read-only, as DataFrames. Each is read when asked for,
    so a run in progress shows its last completed generation."""

    def __init__(self, directory: Path):
        self.dir = directory

    def __repr__(self) -> str:
        return f"ArchiveView({str(self.dir)!r})"

    def _read(self, query):
        with opened(self.dir) as archive:
            run, programs = run_programs(archive)
            return query(archive, run, programs)

    @property
    def programs(self) -> pd.DataFrame:
        """Every program of the run, indexed by id: generation, operator, parents, losses (train,
        val, test, quick), `cv_<protocol>` CV losses, complexity, components, cell, stage, and
        `front` (on the Pareto front of validation loss vs complexity)."""
        return self._read(lambda archive, run, programs: program_frame(programs, cv_by_program(archive, run.id)))

    @property
    def evaluations(self) -> pd.DataFrame:
        """Per program, experiment and split: observed and predicted mean E2E, TTFT, ITL, their APE
        (%), timeouts, E2E percentiles (fully evaluated programs; screened ones have none)."""
        return self._read(
            lambda archive, run, programs: evaluation_frame({p.id: archive.metric_rows(p.id) for p in programs})
        )

    @property
    def cv_scores(self) -> pd.DataFrame:
        """Per program and protocol (`evolve archive cv`, `run --front-cv`): the CV loss, held-out
        APE summary and the settings of the fold fits."""
        return self._read(lambda archive, run, programs: cv_score_frame(archive.cv_scores(run_id=run.id)))

    @property
    def generations(self) -> pd.DataFrame:
        """Per completed generation: children, rejected, promoted, best train and validation loss, seconds."""
        return self._read(lambda archive, run, programs: generation_frame(archive.generations(run.id)))

    def program(self, ref: int | str = "best") -> str:
        """A program (an id, or `best`: the lowest validation loss) as a DSL file with its fitted
        constants and a `# fitted:` header: `evolve archive show ID --source`."""
        return show_source(self.dir, str(ref))


def open_archive(directory: PathSpec | None = None) -> ArchiveView:
    """The archive in `directory` (default: the most recently written one under runs/), read-only.
    No archive there, or one without a run: a one-line UserError."""
    view = ArchiveView(Path(directory) if directory is not None else latest_archive_dir())
    view._read(lambda archive, run, programs: None)
    return view


class APIError(UserError, ValueError):
    """An argument of an API call the matching command would refuse: one line naming it."""


MAX_PATH_CHARS = 4096  # the longest path Linux opens (PATH_MAX): a longer one-line program spec is no path


@contextmanager
def _program_file(program: ProgramSpec) -> Iterator[Path]:
    """The program as a file: its path, or its text (parsed first, so a bad one fails naming its
    line, not a temporary file) written to a temporary directory as program.py."""
    if not isinstance(program, (str, os.PathLike)):
        raise APIError(
            f"program must be a program file's path (a str or os.PathLike) or a program's text (a str holding "
            f"a newline), not {type(program).__name__} {shown(program)}"
        )
    if isinstance(program, os.PathLike) or "\n" not in program:
        if len(os.fspath(program)) > MAX_PATH_CHARS:
            raise APIError(
                f"{cut(os.fspath(program))}: not a program file (longer than any path) and not program text "
                "(which holds a newline)"
            )
        yield Path(program)
        return
    parse_program(program)
    with tempfile.TemporaryDirectory(prefix="stepml-evolve-") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(program)
        yield path


def _path(path: PathSpec | None, name: str = "data") -> Path | None:
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise APIError(
            f"{name} must be a directory's path (a str or os.PathLike), not {type(path).__name__} {shown(path)}"
        )
    return Path(path) if path is not None else None


SETUP_OPTIONS = tuple(f.name for f in fields(EvaluationSetup) if f.name != "data")


def _setup(data: PathSpec | None, options: dict) -> tuple[EvaluationSetup, dict]:
    """The EvaluationSetup the options name (data, workers, semantics, objective, weights,
    prompt_reuse, output_len, cluster), and the options left for the command itself."""
    shared = {k: options.pop(k) for k in SETUP_OPTIONS if k in options}
    if shared.get("weights") is not None:
        shared["weights"] = Path(shared["weights"])
    return EvaluationSetup(data=_path(data), **shared), options


def score(program: ProgramSpec, data: PathSpec | None = None, split: str = "test", **options) -> pd.DataFrame:
    """The program replayed closed-loop on every experiment of `data` (default: the built-in
    synthetic sample) with the constants it holds, scored on `split`: `evolve eval --json`'s
    experiments, one row each; `.attrs` holds `loss` (the objective's), `split` and `data`.
    `options`: the other `evolve eval` options (workers, semantics, objective, weights, prompt_reuse, output_len)."""
    if split not in SCORED_SPLITS:  # as `evolve eval --split` refuses it
        raise APIError(f"split must be one of {', '.join(SCORED_SPLITS)}, not {shown(split)}")
    with _program_file(program) as path:
        setup, rest = _setup(data, dict(options))
        evaluation = evaluate_program(path, setup, split, **rest)
        setup.refuse_bad(evaluation.data)
    frame = metric_frame(evaluation.rows)
    frame.attrs.update(loss=evaluation.loss, split=split, data=evaluation.data.label)
    return frame


@dataclass(frozen=True)
class Fitted:
    """A fit (`evolve fit`): the fitted program files' text, constants and losses."""

    programs: dict[str, str]  # fit group ("all" for the global scope) -> the fitted program file's text
    constants: dict[str, dict[str, float]]  # fit group -> constant -> value
    losses: dict[str, float]  # train, validate, test
    metrics: pd.DataFrame  # per experiment on validate and test
    evaluations: int  # closed-loop evaluations the fit spent
    seconds: float
    # per fit group and constant: what decided it (verdict, why), its prior and z (evolve fit's table)
    identifiability: pd.DataFrame | None = None

    @property
    def program(self) -> str:
        """The fitted program's text (one fit group, as the global scope makes)."""
        if len(self.programs) != 1:
            raise ValueError(f"the fit made {len(self.programs)} programs, one per group: see .programs")
        return next(iter(self.programs.values()))


def fit(
    program: ProgramSpec,
    data: PathSpec | None = None,
    *,
    seed: int = FitConfig.seed,
    max_evals: int | None = FitConfig.max_evals,
    **options,
) -> Fitted:
    """The program's constants fitted on the train split of `data` (default: the synthetic sample)
    and scored on validate and test, as `evolve fit --seed SEED --max-evals N` fits them (same seed
    and data, same constants); nothing is written. `options`: the other `evolve fit` options
    (scope, method, objective, weights, restarts, quick, workers, semantics, prompt_reuse, output_len,
    physics, profile); `.identifiability` says per constant whether the data or its prior decided it."""
    if max_evals is not None and (isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < 1):
        raise APIError(
            f"max_evals must be an integer of at least 1 (as evolve fit --max-evals), not {shown(max_evals)}"
        )
    with _program_file(program) as path, tempfile.TemporaryDirectory(prefix="stepml-evolve-") as out:
        setup, rest = _setup(data, dict(options))
        fitted = fit_program(
            path, setup, seed=seed, max_evals=max_evals, out=Path(out) / f"{path.stem}.fitted.py", **rest
        )
        texts = {group: p.read_text() for group, p in zip(fitted.result.constants, fitted.written)}
    return Fitted(
        texts,
        fitted.result.constants,
        {"train": fitted.result.loss, **fitted.losses},
        metric_frame([r for rows in fitted.rows.values() for r in rows]),
        fitted.result.evaluations,
        fitted.result.seconds,
        pd.DataFrame(
            [{"group": g, **r.to_json()} for g, reports in fitted.identifiability.items() for r in reports],
            columns=[
                "group",
                "name",
                "value",
                "prior",
                "z",
                "data_curvature",
                "prior_curvature",
                "bound",
                "verdict",
                "why",
            ],
        ).set_index(["group", "name"]),
    )


def emit_go(
    program: ProgramSpec | int,
    out: PathSpec | None = None,
    *,
    archive: PathSpec | None = None,
    target: str = DEFAULT_TARGET,
    name: str = DEFAULT_NAME,
    within: float | None = None,
    physics: str = "check",
) -> str:
    """The gofmt-clean Go model (package latency, BLIS's LatencyModel) of a program file or text,
    or of an archive's program: an id, `best` or `simplest` (`within` percent of the best) of
    `archive` (default: the newest under runs/), as `evolve emit-go` chooses it. Written to `out`
    when given. Returns the Go source. physics "check" refuses a program the physics rules refuse
    and has the Go panic at a step below its floor; "off" emits it as it is."""
    spec = str(program) if isinstance(program, int) else program
    with _program_file(spec) as path:
        if out is None:
            source, _ = emitted_sources(
                str(path), _path(archive), target, name, samples=None, within=within, physics=physics
            )
            return source
        emit_program(str(path), _path(archive), Path(out), target=target, name=name, within=within, physics=physics)
        return Path(out).read_text()
