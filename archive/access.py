"""Reading a search archive without writing it: locating one (`--archive` or the newest under
./runs), opening it read-only, resolving a program reference (an id or `best`), a program's stored
rows (per split, per CV fold), its file with the `# fitted:` header and its CV scores as header
fields. What people browse is built on this in evolve/browse/, which program to deploy in
evolve/deploy/. Every failure a user can cause is a `BrowseError` with a one-line message (or the
store's `ArchiveError`, for an archive it cannot read)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from stepml_evolve.evaluator.data.experiments import SPLITS
from stepml_evolve.evaluator.data.prompt_reuse import LEGACY_POLICY
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fit.fitted_header import FittedHeader
from stepml_evolve.evaluator.numbers import fmt
from stepml_evolve.evaluator.scoring.metrics import MetricRow

from .map_elites import best as best_program
from .records import CVScoreRecord, ProgramRecord, RunRecord
from .store import Archive

CV_PREFERENCE = (
    "lomo",
    "lowo",
)  # ties of the CV loss the rules rank by (the protocol most programs have): lomo, else lowo, else others by name


RUNS_DIR = Path("runs")


class BrowseError(UserError):
    """A problem the user can fix (no archive, unknown program, bad option): one line of text."""


def latest_archive_dir(root: Path = RUNS_DIR) -> Path:
    """The directory under `root` whose archive was written most recently."""
    candidates = [d for d in root.glob("*") if (d / Archive.FILE).is_file()] if root.is_dir() else []
    if not candidates:
        raise BrowseError(f"no archive found under {root}/ (pass --archive DIR)")
    return max(candidates, key=_last_write)


def _last_write(directory: Path) -> float:
    # a WAL database is written to archive.sqlite-wal between checkpoints, so look at both
    files = [directory / (Archive.FILE + suffix) for suffix in ("", "-wal")]
    return max(f.stat().st_mtime for f in files if f.exists())


def open_read_only(directory: Path | None) -> Archive:
    """The archive in `directory` (default: the newest under runs/), read-only."""
    return Archive.open(directory if directory is not None else latest_archive_dir())


def run_programs(archive: Archive) -> tuple[RunRecord, list[ProgramRecord]]:
    """The latest run of the archive and all its programs."""
    run = archive.run()
    if run is None:
        raise BrowseError(f"{archive.dir}: the archive holds no run yet")
    return run, archive.programs(run.id)


def resolve(archive: Archive, ref: str) -> ProgramRecord:
    """A program by id, or `best` (the lowest validation loss of the latest run)."""
    if ref.strip().lower() == "best":
        _, programs = run_programs(archive)
        top = best_program(programs)
        if top is None:
            raise BrowseError(f"{archive.dir}: no program has been fully evaluated yet")
        return top
    try:
        pid = int(ref.strip().lstrip("#"))
    except ValueError:
        raise BrowseError(f"{ref!r} is not a program id (a number, or 'best')") from None
    program = archive.program(pid)
    if program is None:
        raise BrowseError(f"program {pid} does not exist in {archive.dir}")
    return program


def operator_label(p: ProgramRecord) -> str:
    """Who made the program: `seed:<name>`, a symbolic operator, or `llm:<model>`."""
    return f"seed:{p.operator_detail}" if p.operator == "seed" and p.operator_detail else p.operator


def protocol_order(protocols) -> list[str]:
    """Protocols in order of preference: lomo, lowo, then any other by name."""
    rank = {p: i for i, p in enumerate(CV_PREFERENCE)}
    return sorted(set(protocols), key=lambda p: (rank.get(p, len(rank)), p))


def split_rows(archive: Archive, program_id: int) -> dict[str, list[MetricRow]]:
    """Per-experiment metric rows of a program by split (train, validate, test); empty when screened only."""
    by_split: dict[str, list[MetricRow]] = {s: [] for s in SPLITS}
    for row in archive.metric_rows(program_id):
        by_split.setdefault(row.split, []).append(row)
    return {s: rows for s, rows in by_split.items() if rows}


def cv_rows(archive: Archive, program_id: int) -> dict[str, list[tuple[str, MetricRow]]]:
    """The held-out experiments of each of a program's CV scores: protocol -> [(fold, row)], by fold."""
    out: dict[str, list[tuple[str, MetricRow]]] = {}
    for e in archive.cv_evaluations(program_id):
        out.setdefault(e.protocol, []).append((e.fold, e.metric_row()))
    return {proto: out[proto] for proto in protocol_order(out)}


def run_prompt_reuse(config: dict | None) -> str:
    """The --prompt-reuse policy a run replayed its data with (runs stored before it existed: system prompts only)."""
    return ((config or {}).get("search") or {}).get("prompt_reuse", LEGACY_POLICY)


def fitted_header(archive: Archive, program: ProgramRecord) -> FittedHeader:
    """Where an archived program comes from, for the `# fitted:` header of its file."""
    run = archive.run()
    return FittedHeader(
        data=run.data_label,
        seed=run.seed,
        program_id=program.id,
        archive=str(archive.dir),
        prompt_reuse=run_prompt_reuse(run.config),
        generation=program.generation,
        operator=operator_label(program),
        train_loss=program.train_loss,
        val_loss=program.val_loss,
        test_loss=program.test_loss,
    )


def program_file_text(archive: Archive, program: ProgramRecord) -> str:
    """The program as a DSL file with its fitted constants and a `# fitted:` header naming where it
    came from: input for `evolve fit`, `eval`, `emit-go` and `run --seed-programs`."""
    from stepml_evolve.evaluator.dsl import parse_program

    prog = parse_program(program.source)
    return prog.with_constants(
        program.constants or prog.constants, header=fitted_header(archive, program).render()
    ).source


def cv_header(scores: list[CVScoreRecord]) -> dict[str, str]:
    """A program's CV scores as labelled one-line fields (emit-go's Go file header)."""
    by = {s.protocol: s for s in scores}
    out = {}
    for proto in protocol_order(by):
        s = by[proto]
        out[f"cv {proto}"] = (
            f"loss {fmt(s.loss, '.4f', keep_inf=True)}; held-out mean APE E2E "
            f"{fmt(s.e2e_mean, '.1f', keep_inf=True)}%, TTFT {fmt(s.ttft_mean, '.1f', keep_inf=True)}% "
            f"({len(s.folds)} folds, fit seed {s.seed}, max-evals {s.max_evals or 'default'}, {s.method})"
        )
    return out


@contextmanager
def opened(directory: Path | None):
    archive = open_read_only(directory)
    try:
        yield archive
    finally:
        archive.close()
