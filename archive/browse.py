"""Read-only queries over a search archive, shaped for people and scripts (no printing here).

Owns: locating an archive (`--archive` or the newest under ./runs), opening it without writing,
resolving a program reference (an id or `best`), the program rows behind `evolve archive list`
and `pareto`, a program's detail for `show` (lineage back to a seed, per-split evaluation rows in
the shape of `evolve.tables.metrics_table`), its file for `show --source`, and the comparison
behind `diff`; each command's whole query is one function of the archive directory (at the end).
Every failure a user can cause is a `BrowseError` with a one-line message (or the store's
`ArchiveError`, for an archive it cannot read).
"""
from __future__ import annotations

import difflib
import math
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from evaluator.errors import UserError
from evaluator.experiments import SPLITS
from evaluator.fitted_header import FittedHeader
from evaluator.metrics import MetricRow

from .grid import cell_label, cell_of, pareto_front
from .grid import best as best_program
from .records import ProgramRecord, RunRecord
from .store import Archive

SORT_KEYS = ("id", "generation", "train", "val", "complexity")
RUNS_DIR = Path("runs")


class BrowseError(UserError):
    """A problem the user can fix (no archive, unknown program, bad option): one line of text."""


# ---- locating and opening ----

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


def open_archive(directory: Path | None) -> Archive:
    """Open an archive read-only (a browse never writes, even to a run in progress)."""
    directory = Path(directory) if directory is not None else latest_archive_dir()
    path = directory / Archive.FILE
    if not path.is_file():
        raise BrowseError(f"{directory}: no archive here ({Archive.FILE} not found)")
    try:
        return Archive(directory, read_only=True)
    except sqlite3.Error as e:
        raise BrowseError(f"{path}: not a readable archive ({e})") from None


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


# ---- program rows (list, pareto) ----

def operator_label(p: ProgramRecord) -> str:
    """Who made the program: `seed:<name>`, a symbolic operator, or `llm:<model>`."""
    return f"seed:{p.operator_detail}" if p.operator == "seed" and p.operator_detail else p.operator


def program_row(p: ProgramRecord, front_ids: set[int] = frozenset()) -> dict:
    """One program in the documented `list --json` shape (plus whether it is on the front)."""
    return {
        "id": p.id, "generation": p.generation, "operator": operator_label(p), "operator_detail": p.operator_detail,
        "parents": list(p.parents), "train_loss": p.train_loss, "val_loss": p.val_loss, "test_loss": p.test_loss,
        "quick_loss": p.quick_loss, "complexity": p.complexity, "n_components": p.n_components,
        "components": list(p.components), "stage": p.stage, "cell": list(cell_of(p.complexity, p.n_components)),
        "front": p.id in front_ids,
    }


def parse_cell(text: str) -> tuple[int, int]:
    try:
        c, n = (int(x) for x in text.split(","))
    except ValueError:
        raise BrowseError(f"--cell must be 'C,N' (complexity bin, number of components), not {text!r}") from None
    return (c, n)


def _loss_key(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) else math.inf


def _by_loss(key: str):
    """Lowest loss first, ties to the simpler program; programs without it (screened-only) after, by quick loss."""
    def sort_key(r: dict):
        missing = r[key] is None or not math.isfinite(r[key])
        return (_loss_key(r[key]), _loss_key(r["quick_loss"]) if missing else 0.0, r["complexity"], r["id"])
    return sort_key


def _sort_key(sort: str):
    if sort == "id":
        return lambda r: r["id"]
    if sort == "generation":
        return lambda r: (r["generation"], r["id"])
    if sort == "complexity":
        return lambda r: (r["complexity"], _loss_key(r["val_loss"]), r["id"])
    return _by_loss("train_loss" if sort == "train" else "val_loss")


def select_rows(programs: list[ProgramRecord], *, include_screened: bool = False, front_only: bool = False,
                cell: tuple[int, int] | None = None, operator: str | None = None, sort: str = "val") -> list[dict]:
    """The rows of `evolve archive list`: filtered, then sorted (ties by id)."""
    if sort not in SORT_KEYS:
        raise BrowseError(f"--sort must be one of {', '.join(SORT_KEYS)}, not {sort!r}")
    front_ids = {p.id for p in pareto_front(programs)}
    rows = []
    for p in programs:
        if not include_screened and p.stage not in ("seed", "full"):
            continue
        if front_only and p.id not in front_ids:
            continue
        if cell is not None and cell_of(p.complexity, p.n_components) != cell:
            continue
        if operator and operator.lower() not in operator_label(p).lower():
            continue
        rows.append(program_row(p, front_ids))
    return sorted(rows, key=_sort_key(sort))


def pareto_rows(programs: list[ProgramRecord]) -> list[dict]:
    """The front (validation loss vs complexity), by increasing complexity."""
    front = pareto_front(programs)
    ids = {p.id for p in front}
    return [program_row(p, ids) for p in front]


# ---- one program (show) ----

def split_rows(archive: Archive, program_id: int) -> dict[str, list[MetricRow]]:
    """Per-experiment metric rows of a program by split (train, validate, test); empty when screened only."""
    by_split: dict[str, list[MetricRow]] = {s: [] for s in SPLITS}
    for row in archive.metric_rows(program_id):
        by_split.setdefault(row.split, []).append(row)
    return {s: rows for s, rows in by_split.items() if rows}


def lineage(archive: Archive, program: ProgramRecord) -> list[dict]:
    """The program, its first parent, that one's first parent, ... down to a seed.

    Each step names the operator that made it; a crossover's second parent is listed under
    `other_parents` but not followed.
    """
    steps: list[dict] = []
    seen: set[int] = set()
    current: ProgramRecord | None = program
    while current is not None and current.id not in seen:
        seen.add(current.id)
        steps.append({"id": current.id, "generation": current.generation, "operator": operator_label(current),
                      "operator_detail": current.operator_detail, "parents": list(current.parents),
                      "other_parents": list(current.parents[1:]), "stage": current.stage,
                      "train_loss": current.train_loss, "val_loss": current.val_loss, "complexity": current.complexity})
        current = archive.program(current.parents[0]) if current.parents else None
    return steps


def program_detail(archive: Archive, program: ProgramRecord) -> dict:
    """Everything `evolve archive show` prints."""
    _, programs = run_programs(archive)
    front_ids = {p.id for p in pareto_front(programs)}
    cell = cell_of(program.complexity, program.n_components)
    return {
        "program": {**program_row(program, front_ids), "cell_label": cell_label(cell), "screen_loss": program.screen_loss,
                    "island": program.island, "source": program.source, "constants": program.constants},
        "lineage": lineage(archive, program),
        "evaluations": split_rows(archive, program.id),
    }


def fitted_header(archive: Archive, program: ProgramRecord) -> FittedHeader:
    """Where an archived program comes from, for the `# fitted:` header of its file."""
    run = archive.run()
    return FittedHeader(data=run.data_label, seed=run.seed, program_id=program.id, archive=str(archive.dir),
                        generation=program.generation, operator=operator_label(program),
                        train_loss=program.train_loss, val_loss=program.val_loss, test_loss=program.test_loss)


def program_file_text(archive: Archive, program: ProgramRecord) -> str:
    """The program as a DSL file with its fitted constants and a `# fitted:` header naming where it
    came from: input for `evolve fit`, `eval`, `emit-go` and `run --seeds`."""
    from evaluator.dsl import parse_program

    prog = parse_program(program.source)
    return prog.with_constants(program.constants or prog.constants, header=fitted_header(archive, program).render()).source


# ---- two programs (diff) ----

DIFF_METRICS = ("train_loss", "val_loss", "test_loss", "complexity", "n_components")


def _change(a: float | None, b: float | None) -> dict:
    known = a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
    return {"a": a, "b": b, "delta": (b - a) if known else None}


def diff(archive: Archive, a: ProgramRecord, b: ProgramRecord) -> dict:
    """Unified diff of the sources (A -> B) and how the metrics change, B minus A."""
    source_diff = list(difflib.unified_diff(a.source.splitlines(), b.source.splitlines(),
                                            fromfile=f"#{a.id}", tofile=f"#{b.id}", lineterm=""))
    va = {r.name: r for r in archive.metric_rows(a.id, "validate")}
    vb = {r.name: r for r in archive.metric_rows(b.id, "validate")}
    experiments = []
    for name in sorted(set(va) | set(vb)):
        ra, rb = va.get(name), vb.get(name)
        experiments.append({"name": name, **{f"ape_{k}": _change(ra and getattr(ra.ape, k), rb and getattr(rb.ape, k))
                                             for k in ("e2e", "ttft")}})
    return {
        "a": program_row(a), "b": program_row(b), "source_diff": source_diff,
        "metrics": {m: _change(getattr(a, m), getattr(b, m)) for m in DIFF_METRICS},
        "validate_experiments": experiments,
    }


# ---- one function per command, from the archive directory ----

@dataclass(frozen=True)
class Listing:
    """Program rows (`list`, `pareto`) and the archive they come from."""

    archive_dir: Path
    rows: list[dict]


@contextmanager
def opened(directory: Path | None):
    archive = open_archive(directory)
    try:
        yield archive
    finally:
        archive.close()


def list_programs(directory: Path | None, *, sort: str = "val", front_only: bool = False, cell: str | None = None,
                  operator: str | None = None, include_screened: bool = False) -> Listing:
    """`evolve archive list`: cell is "C,N" (complexity bin, number of components)."""
    wanted_cell = parse_cell(cell) if cell else None
    with opened(directory) as archive:
        _, programs = run_programs(archive)
        return Listing(archive.dir, select_rows(programs, include_screened=include_screened, front_only=front_only,
                                                cell=wanted_cell, operator=operator, sort=sort))


def front_programs(directory: Path | None) -> Listing:
    """`evolve archive pareto`."""
    with opened(directory) as archive:
        _, programs = run_programs(archive)
        return Listing(archive.dir, pareto_rows(programs))


def show_program(directory: Path | None, ref: str) -> dict:
    """`evolve archive show`."""
    with opened(directory) as archive:
        return program_detail(archive, resolve(archive, ref))


def show_source(directory: Path | None, ref: str) -> str:
    """`evolve archive show --source`."""
    with opened(directory) as archive:
        return program_file_text(archive, resolve(archive, ref))


def compare_programs(directory: Path | None, a: str, b: str) -> dict:
    """`evolve archive diff`."""
    with opened(directory) as archive:
        return diff(archive, resolve(archive, a), resolve(archive, b))
