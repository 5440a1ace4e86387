"""What people browse in a search archive, shaped for people and scripts (no printing here): the
program rows behind `evolve archive list` and `pareto` (with their CV scores, ranked as the
deployment rules rank them), a program's detail for `show` (lineage back to a seed, per-split
evaluation rows, CV scores and held-out rows), the comparison behind `diff` and the generations
behind `history`; each command's whole query is one function of the archive directory (at the end).
Locating, opening and resolving are archive.access's; the deployment rules are evolve/deploy's."""

from __future__ import annotations

import difflib
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.archive.access import (
    BrowseError,
    cv_rows,
    fitted_header,
    opened,
    operator_label,
    program_file_text,
    protocol_order,
    resolve,
    run_programs,
    split_rows,
)
from stepml_evolve.archive.map_elites import cell_label, cell_of, pareto_front
from stepml_evolve.archive.records import CVScoreRecord, ProgramRecord, generation_pace, refit_of
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.dsl import parse_program
from stepml_evolve.evaluator.numbers import finite
from stepml_evolve.evolve.deploy.pins import pins_of, pins_text
from stepml_evolve.evolve.deploy.scores import CVScores, cv_by_program, ranked_cv

from .choices import SORT_KEYS


def cv_json(scores: dict[str, CVScoreRecord] | None) -> dict:
    """A program's `cv` entry: protocol -> {loss, e2e, ttft, itl: {mean, median, max}, seed, max_evals, ...}."""
    scores = scores or {}
    return {proto: scores[proto].to_json() for proto in protocol_order(scores)}


def program_row(
    p: ProgramRecord,
    front_ids: set[int] = frozenset(),
    cv: dict[str, CVScoreRecord] | None = None,
    refits: dict[int, int] | None = None,
) -> dict:
    """One program in the documented `list --json` shape (plus whether it is on the front).
    refit_of: the older program of the same structure it refits (records.refit_of), or None."""
    return {
        "id": p.id,
        "generation": p.generation,
        "operator": operator_label(p),
        "operator_detail": p.operator_detail,
        "refit_of": (refits or {}).get(p.id),
        "parents": list(p.parents),
        "train_loss": p.train_loss,
        "val_loss": p.val_loss,
        "test_loss": p.test_loss,
        "quick_loss": p.quick_loss,
        "complexity": p.complexity,
        "n_components": p.n_components,
        "components": list(p.components),
        "stage": p.stage,
        "cell": list(cell_of(p.complexity, p.n_components)),
        "cv": cv_json(cv),
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


def _by_cv(ranked: dict[int, CVScoreRecord]):
    """Lowest CV loss among the `ranked` scores first (ties to the simpler program); the programs
    without one of them after (no score, or one of another setting), by validation loss as
    `--sort val` orders them."""
    by_val = _by_loss("val_loss")

    def sort_key(r: dict):
        if r["id"] in ranked:
            return (0, ranked[r["id"]].loss, r["complexity"], r["id"])
        return (1, *by_val(r))

    return sort_key


def _sort_key(sort: str, ranked: dict[int, CVScoreRecord] | None = None):
    if sort == "cv":
        return _by_cv(ranked or {})
    if sort == "id":
        return lambda r: r["id"]
    if sort == "generation":
        return lambda r: (r["generation"], r["id"])
    if sort == "complexity":
        return lambda r: (r["complexity"], _loss_key(r["val_loss"]), r["id"])
    return _by_loss("train_loss" if sort == "train" else "val_loss")


def select_rows(
    programs: list[ProgramRecord],
    *,
    include_screened: bool = False,
    front_only: bool = False,
    cell: tuple[int, int] | None = None,
    operator: str | None = None,
    sort: str = "val",
    cv: CVScores | None = None,
) -> list[dict]:
    """The rows of `evolve archive list`: filtered, then sorted (ties by id). `cv`: the run's CV
    scores (each row's `cv`; `sort="cv"` ranks by the preferred protocol's CV loss among the scores
    of one setting, as the deployment rules do: `ranked_cv`)."""
    if sort not in SORT_KEYS:
        raise BrowseError(f"--sort must be one of {', '.join(SORT_KEYS)}, not {sort!r}")
    cv = cv or {}
    front_ids = {p.id for p in pareto_front(programs)}
    refits = refit_of(programs)
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
        rows.append(program_row(p, front_ids, cv.get(p.id), refits))
    ranked = ranked_cv(cv, {p.id for p in programs})[1] if sort == "cv" else None
    return sorted(rows, key=_sort_key(sort, ranked))


def pareto_rows(programs: list[ProgramRecord], cv: CVScores | None = None) -> list[dict]:
    """The front (validation loss vs complexity), by increasing complexity."""
    front = pareto_front(programs)
    ids = {p.id for p in front}
    refits = refit_of(programs)
    return [program_row(p, ids, (cv or {}).get(p.id), refits) for p in front]


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
        steps.append(
            {
                "id": current.id,
                "generation": current.generation,
                "operator": operator_label(current),
                "operator_detail": current.operator_detail,
                "parents": list(current.parents),
                "other_parents": list(current.parents[1:]),
                "stage": current.stage,
                "train_loss": current.train_loss,
                "val_loss": current.val_loss,
                "complexity": current.complexity,
            }
        )
        current = archive.program(current.parents[0]) if current.parents else None
    return steps


def program_detail(archive: Archive, program: ProgramRecord) -> dict:
    """Everything `evolve archive show` prints."""
    _, programs = run_programs(archive)
    front_ids = {p.id for p in pareto_front(programs)}
    cell = cell_of(program.complexity, program.n_components)
    scores = {s.protocol: s for s in archive.cv_scores(program.id)}
    return {
        "program": {
            **program_row(program, front_ids, scores, refit_of(programs)),
            "cell_label": cell_label(cell),
            "screen_loss": program.screen_loss,
            "island": program.island,
            "source": program.source,
            "constants": program.constants,
            # the constants the run's end pinned to its seed's before deploying it (evolve/deploy/pins.py)
            "pins": pins_of(archive, program),
        },
        "lineage": lineage(archive, program),
        "evaluations": split_rows(archive, program.id),
        # per protocol, the held-out experiments (split "all") with the fold that held each out
        "cv_evaluations": {
            proto: [{"fold": fold, **row.to_json()} for fold, row in rows]
            for proto, rows in cv_rows(archive, program.id).items()
        },
    }


DIFF_METRICS = ("train_loss", "val_loss", "test_loss", "complexity", "n_components")


def _change(a: float | None, b: float | None) -> dict:
    known = a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
    return {"a": a, "b": b, "delta": (b - a) if known else None}


def diff(archive: Archive, a: ProgramRecord, b: ProgramRecord) -> dict:
    """Unified diff of the sources (A -> B) and how the metrics change, B minus A."""
    source_diff = list(
        difflib.unified_diff(
            a.source.splitlines(), b.source.splitlines(), fromfile=f"#{a.id}", tofile=f"#{b.id}", lineterm=""
        )
    )
    va = {r.name: r for r in archive.metric_rows(a.id, "validate")}
    vb = {r.name: r for r in archive.metric_rows(b.id, "validate")}
    experiments = []
    for name in sorted(set(va) | set(vb)):
        ra, rb = va.get(name), vb.get(name)
        experiments.append(
            {
                "name": name,
                **{f"ape_{k}": _change(ra and getattr(ra.ape, k), rb and getattr(rb.ape, k)) for k in ("e2e", "ttft")},
            }
        )
    return {
        "a": program_row(a, cv={s.protocol: s for s in archive.cv_scores(a.id)}),
        "b": program_row(b, cv={s.protocol: s for s in archive.cv_scores(b.id)}),
        "source_diff": source_diff,
        "metrics": {m: _change(getattr(a, m), getattr(b, m)) for m in DIFF_METRICS},
        "validate_experiments": experiments,
    }


def generation_history(archive: Archive, every: int | None = None) -> dict:
    """The latest run's generations as `evolve archive history` shows them: the run's pace (wall
    seconds, generation 0 apart, generations per hour after it) and one row per `every`-th
    generation, per generation whose best validation loss (the CV loss of a --cv run) improved
    (with the program that did it) and for the last. `every` None: about 25 rows."""
    run, programs = run_programs(archive)
    gens = archive.generations(run.id)
    if every is not None and every < 1:
        raise BrowseError(f"--every must be at least 1, not {every}")
    if not gens:
        raise BrowseError(f"{archive.dir}: the run has completed no generation yet")
    step = every or max(1, math.ceil(len(gens) / 25))
    full = [p for p in programs if p.stage in ("seed", "full") and finite(p.val_loss)]
    elapsed = list(itertools.accumulate(g.seconds for g in gens))
    rows, best = [], math.inf
    for i, g in enumerate(gens):
        improved = finite(g.best_val) and g.best_val < best
        if improved:
            best = g.best_val
        if not (improved or g.generation % step == 0 or i == len(gens) - 1):
            continue
        new_best = None
        if improved:
            mine = [p for p in full if p.generation == g.generation]
            new_best = min(mine, key=lambda p: p.val_loss).id if mine else None
        rows.append(
            {
                "generation": g.generation,
                "elapsed_s": elapsed[i],
                "seconds": g.seconds,
                "promoted": g.n_promoted,
                "evaluations": g.evaluations,
                "best_train": g.best_train,
                "best_val": g.best_val,
                "improved": improved,
                "new_best": new_best,
            }
        )
    zero, mean, per_hour = generation_pace(gens)
    cv = ((run.config or {}).get("search") or {}).get("cv", "none")
    return {
        "archive": str(archive.dir),
        "cv": cv,
        "generations": gens[-1].generation,
        "wall_s": elapsed[-1],
        "generation0_s": zero,
        "mean_s": mean,
        "per_hour": per_hour,
        "evaluations": sum(g.evaluations for g in gens),
        "rows": rows,
    }


@dataclass(frozen=True)
class Listing:
    """Program rows (`list`, `pareto`) and the archive they come from."""

    archive_dir: Path
    rows: list[dict]


def list_programs(
    directory: Path | None,
    *,
    sort: str = "val",
    front_only: bool = False,
    cell: str | None = None,
    operator: str | None = None,
    include_screened: bool = False,
) -> Listing:
    """`evolve archive list`: cell is "C,N" (complexity bin, number of components)."""
    wanted_cell = parse_cell(cell) if cell else None
    with opened(directory) as archive:
        run, programs = run_programs(archive)
        return Listing(
            archive.dir,
            select_rows(
                programs,
                include_screened=include_screened,
                front_only=front_only,
                cell=wanted_cell,
                operator=operator,
                sort=sort,
                cv=cv_by_program(archive, run.id),
            ),
        )


def front_programs(directory: Path | None) -> Listing:
    """`evolve archive pareto`."""
    with opened(directory) as archive:
        run, programs = run_programs(archive)
        return Listing(archive.dir, pareto_rows(programs, cv_by_program(archive, run.id)))


def show_program(directory: Path | None, ref: str) -> dict:
    """`evolve archive show`."""
    with opened(directory) as archive:
        return program_detail(archive, resolve(archive, ref))


def show_source(directory: Path | None, ref: str, deployed: bool = False) -> str:
    """`evolve archive show --source` (`--deployed`: with the constants the run's end pinned to its
    seed's, as emit-go deploys it)."""
    with opened(directory) as archive:
        record = resolve(archive, ref)
        text = program_file_text(archive, record)
        pins = pins_of(archive, record) if deployed else None
        if not pins:
            return text
        header = f"{fitted_header(archive, record).render()}\ndeployed with {pins_text(pins)}"
    return parse_program(text).with_constants(pins["constants"], header=header).source


def compare_programs(directory: Path | None, a: str, b: str) -> dict:
    """`evolve archive diff`."""
    with opened(directory) as archive:
        return diff(archive, resolve(archive, a), resolve(archive, b))


def run_history(directory: Path | None, every: int | None = None) -> dict:
    """`evolve archive history`."""
    with opened(directory) as archive:
        return generation_history(archive, every)
