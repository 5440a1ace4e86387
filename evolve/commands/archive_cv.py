"""`evolve archive cv`: archived programs cross-validated with their run's data and fitting
settings (evolve/deploy/front_cv.py fits them as a run's end does), the scores stored in the
archive (`cv_scores`, `cv_evaluations`), and `evolve archive migrate` (an archive of an older
schema upgraded in place)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.archive.access import latest_archive_dir, resolve, run_programs
from stepml_evolve.archive.map_elites import pareto_front
from stepml_evolve.archive.records import ProgramRecord, RunRecord
from stepml_evolve.archive.store import SCHEMA_VERSION, Archive
from stepml_evolve.evaluator.choices import DEFAULT_PROTOCOL
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fit.crossval import make_folds
from stepml_evolve.evaluator.fit.fitting import FitConfig
from stepml_evolve.evaluator.say import Say, quiet
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.deploy.front_cv import ProgramCV, RunFitSettings, cross_validate_programs, run_fit_settings
from stepml_evolve.evolve.search import RunSettings

from .evaluation_setup import EvaluationSetup, FitProgress, no_progress


class ArchiveCVError(UserError):
    """A cross-validation of archived programs that cannot run (which programs, which data): one line."""


# ---- the run's settings and data ----


def run_data(run: RunRecord, archive_dir: Path, data: Path | None = None, say: Say = quiet) -> LoadedData:
    """The experiments the run searched on: `data` if given, else the directory it recorded (the
    synthetic sample for a synthetic run); an error naming the directory if it is not there or its
    experiment files are not the run's (the fingerprint `--resume` checks)."""
    directory = data if data is not None else (None if run.synthetic else Path(run.data_label))
    if directory is not None and not Path(directory).is_dir():
        raise ArchiveCVError(
            f"{directory}: the run's data is not there (the run in {archive_dir} searched on "
            f"{run.data_label}); pass --data DIR with its experiments"
        )
    search = RunSettings.stored(run.config).search
    # the run's own experiments (the fingerprint below says so), bad ones left out as the run did
    loaded = EvaluationSetup(directory, prompt_reuse=search["prompt_reuse"], skip_bad=True).load(say)
    if loaded.fingerprint() != run.data_fingerprint:
        raise ArchiveCVError(
            f"{loaded.directory}: not the data the run in {archive_dir} searched on ({run.data_label}): "
            "its experiment files differ; pass --data DIR with the run's experiments"
        )
    return loaded


# ---- scoring programs (the library function a search calls at the end of a run) ----


# ---- `evolve archive cv` and `evolve archive migrate` ----


def open_writable(directory: Path | None) -> Archive:
    """The archive in `directory` (default: the newest under runs/) opened for writing, which
    migrates an older schema in place (`Archive.migrated_from` says from which)."""
    return Archive.open(directory if directory is not None else latest_archive_dir(), writable=True)


@dataclass
class ArchiveCV:
    archive_dir: Path
    data: LoadedData
    protocol: str
    fit: RunFitSettings
    programs: list[ProgramCV]
    migrated_from: int | None = None

    def to_json(self) -> dict:
        c = self.fit.config
        return {
            "archive": str(self.archive_dir),
            "data": self.data.label,
            "protocol": self.protocol,
            "seed": c.seed,
            "max_evals": c.max_evals,
            "method": c.method,
            **c.objective.settings(),
            "semantics": self.fit.semantics,
            "programs": [p.to_json() for p in self.programs],
        }


def _chosen(
    archive: Archive, run: RunRecord, programs: list[ProgramRecord], refs: list[str], front: bool
) -> list[ProgramRecord]:
    if refs and front:
        raise ArchiveCVError("give program ids or --front, not both")
    if not refs:
        chosen = pareto_front(programs)
        if not chosen:
            raise ArchiveCVError(f"{archive.dir}: no program has been fully evaluated yet, so the front is empty")
        return chosen
    chosen: dict[int, ProgramRecord] = {}
    for ref in refs:
        p = resolve(archive, ref)
        if p.run_id != run.id:
            raise ArchiveCVError(
                f"program {p.id} belongs to run {p.run_id}, not to the latest run {run.id} of {archive.dir}"
            )
        chosen.setdefault(p.id, p)
    return list(chosen.values())


def cross_validate_archive(
    archive_dir: Path | None,
    refs: list[str] | None = None,
    *,
    front: bool = False,
    protocol: str = DEFAULT_PROTOCOL,
    seed: int = FitConfig.seed,
    max_evals: int | None = FitConfig.max_evals,
    again: bool = False,
    data: Path | None = None,
    workers: int | None = None,
    say: Say = quiet,
    progress: FitProgress = no_progress,
) -> ArchiveCV:
    """`evolve archive cv`: the programs `refs` (ids or `best`), or the latest run's Pareto front,
    cross-validated with the run's data (`data` overrides where it is looked for) and settings.
    Every check (programs, data, folds) comes before the first fit; scores are stored one by one."""
    archive = open_writable(archive_dir)
    try:
        if archive.migrated_from is not None:
            say(f"{archive.dir}: archive migrated from schema {archive.migrated_from} to {SCHEMA_VERSION}")
        run, programs = run_programs(archive)
        chosen = _chosen(archive, run, programs, list(refs or ()), front)
        fit = run_fit_settings(run, seed, max_evals)
        loaded = run_data(run, archive.dir, data, say)
        make_folds(protocol, loaded.experiments)  # a protocol the data cannot serve fails before the pool starts
        with (
            ReplayPool(loaded.experiments, workers, semantics=fit.semantics, floor=fit.config.floor) as pool,
            progress() as on_progress,
        ):
            done = cross_validate_programs(
                archive, chosen, loaded, pool, protocol, fit, again=again, progress=on_progress, say=say
            )
        return ArchiveCV(archive.dir, loaded, protocol, fit, done, archive.migrated_from)
    finally:
        archive.close()


def migrate_archive(archive_dir: Path | None) -> tuple[Path, int | None]:
    """`evolve archive migrate`: the archive opened for writing (which migrates it); returns its
    directory and the schema it was migrated from (None: already current)."""
    archive = open_writable(archive_dir)
    try:
        return archive.dir, archive.migrated_from
    finally:
        archive.close()
