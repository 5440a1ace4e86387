"""`evolve archive pin`: archived children's constants their training data cannot tell from their
seed's, pinned to the seed's fit with the run's data and settings (what the run's end does to the
child `guarded` deploys), stored for emit-go and blis-compare."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.archive.access import resolve, run_programs
from stepml_evolve.archive.records import ProgramRecord
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.say import Say, quiet
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.deploy.front_cv import run_fit_settings
from stepml_evolve.evolve.deploy.pins import pin_program
from stepml_evolve.evolve.deploy.rules import own_seed

from .archive_cv import open_writable, run_data


class ArchivePinError(UserError):
    pass


@dataclass
class PinnedProgram:
    program: ProgramRecord
    seed: ProgramRecord
    pins: dict  # Pinning.to_json() and the seed's id, as the run's summary keeps it

    def to_json(self) -> dict:
        return {"id": self.program.id, **self.pins}


def pin_archive_programs(
    archive_dir: Path | None,
    refs: list[str],
    data: Path | None = None,
    workers: int | None = None,
    say: Say = quiet,
) -> tuple[Path, list[PinnedProgram]]:
    """Pin each program of `refs` (ids or `best`; children of the latest run) against its own seed,
    on the run's training split with its objective and floor; every check comes before the first
    replay, and each program's pins are stored as soon as they are made."""
    archive = open_writable(archive_dir)
    try:
        run, programs = run_programs(archive)
        by_id = {p.id: p for p in programs}
        chosen: list[tuple[ProgramRecord, ProgramRecord]] = []
        for ref in refs:
            p = resolve(archive, ref)
            if p.run_id != run.id:
                raise ArchivePinError(
                    f"program {p.id} belongs to run {p.run_id}, not to the latest run {run.id} of {archive.dir}"
                )
            seed = own_seed(p, by_id)
            if seed.id == p.id:
                raise ArchivePinError(f"program {p.id} is a seed: it has no seed to pin its constants to")
            chosen.append((p, seed))
        fit = run_fit_settings(run)
        loaded = run_data(run, archive.dir, data, say)
        out, summary = [], run.summary or {}
        with ReplayPool(loaded.experiments, workers, semantics=fit.semantics, floor=fit.config.floor) as pool:
            for p, seed in chosen:
                summary = pin_program(archive, p, seed, loaded, pool, fit.config, summary, say)
                out.append(PinnedProgram(p, seed, summary["pins"][str(p.id)]))
        return archive.dir, out
    finally:
        archive.close()
