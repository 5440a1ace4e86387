"""Read-only queries over a search archive, shaped for people and scripts (no printing here).

Owns: locating an archive (`--archive` or the newest under ./runs), opening it without writing,
resolving a program reference (an id or `best`), the program rows behind `evolve archive list`
and `pareto` (with their CV scores), a program's detail for `show` (lineage back to a seed,
per-split evaluation rows in the shape of `evolve.tables.metrics_table`, CV scores and held-out
rows), its file for `show --source` and the comparison behind `diff` (emit-go's deployment rules are
in deployment.py); each command's whole query is one function of the archive directory (at the end).
Every failure a user can cause is a `BrowseError` with a one-line message (or the store's
`ArchiveError`, for an archive it cannot read).
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.evaluator.data.experiments import SPLITS
from stepml_evolve.evaluator.data.prompt_reuse import LEGACY_POLICY
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fit.fitted_header import FittedHeader
from stepml_evolve.evaluator.numbers import fmt
from stepml_evolve.evaluator.scoring.metrics import MetricRow

from .choices import SORT_KEYS
from .map_elites import best as best_program
from .map_elites import cell_label, cell_of, pareto_front
from .records import CVScoreRecord, ProgramRecord, RunRecord, generation_pace, refit_of
from .store import Archive

CV_PREFERENCE = (
    "lomo",
    "lowo",
)  # the CV loss `best`, `simplest` and `list --sort cv` use: lomo, else lowo, else others by name
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


# ---- program rows (list, pareto) ----


def operator_label(p: ProgramRecord) -> str:
    """Who made the program: `seed:<name>`, a symbolic operator, or `llm:<model>`."""
    return f"seed:{p.operator_detail}" if p.operator == "seed" and p.operator_detail else p.operator


# ---- CV scores ----

CVScores = dict[int, dict[str, CVScoreRecord]]  # program id -> protocol -> score


def protocol_order(protocols) -> list[str]:
    """Protocols in order of preference: lomo, lowo, then any other by name."""
    rank = {p: i for i, p in enumerate(CV_PREFERENCE)}
    return sorted(set(protocols), key=lambda p: (rank.get(p, len(rank)), p))


def cv_by_program(archive: Archive, run_id: int) -> CVScores:
    out: CVScores = {}
    for s in archive.cv_scores(run_id=run_id):
        out.setdefault(s.program_id, {})[s.protocol] = s
    return out


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def preferred_protocol(cv: CVScores, program_ids: set[int] | None = None) -> str | None:
    """The protocol whose CV loss ranks programs: the first of CV_PREFERENCE (then any other by
    name) that some program (of `program_ids`, if given) has a finite score of; None if none has."""
    have = {
        proto
        for pid, scores in cv.items()
        if program_ids is None or pid in program_ids
        for proto, s in scores.items()
        if _finite(s.loss)
    }
    order = protocol_order(have)
    return order[0] if order else None


def comparable(scores: dict[int, CVScoreRecord]) -> tuple[dict[int, CVScoreRecord], str, int]:
    """The scores of one protocol that may be ranked against each other, the settings they share (in
    words) and how many scores are left out. A fold fit's budget and method shift every program's CV
    loss one way (on the real data, regime_switch's LOMO at fold seed 0: 742 with the default
    budget, 444 with 8 evaluations a fold), so only scores of one setting are ranked: the setting
    most programs were scored with (the run's own CV scores its front and their seeds alike; ties:
    the newest score's). The fold fits' seed is not part of a setting: it is a draw, different for
    every program whatever its number (regime_switch at 8 evaluations: 444, 2,822, 367 at seeds 0,
    7, 1; the --cv lomo run's #960: 48.9, 44.3, 47.6), and a search under --cv gives every promoted
    child a seed of its own."""
    groups: dict[str, dict[int, CVScoreRecord]] = {}
    for pid, s in scores.items():
        groups.setdefault(json.dumps(_procedure(s), sort_keys=True), {})[pid] = s
    if not groups:
        return {}, "", 0
    kept = max(groups.values(), key=lambda g: (len(g), max(s.created for s in g.values())))
    return kept, _settings_words(list(kept.values())), len(scores) - len(kept)


def _procedure(s: CVScoreRecord) -> dict:
    return {k: v for k, v in s.settings().items() if k != "seed"}


def _settings_words(scores: list[CVScoreRecord]) -> str:
    s = scores[0]
    seeds = {x.seed for x in scores}
    seed = f"seed {s.seed}" if len(seeds) == 1 else "a seed per program"
    budget = f"max-evals {s.max_evals}" if s.max_evals else "the default budget"
    return f"{seed}, {budget}, {s.method or 'the default method'}, {s.objective}"


def ranked_cv(cv: CVScores, program_ids: set[int]) -> tuple[str | None, dict[int, CVScoreRecord], str, int]:
    """What ranks programs by CV loss: the preferred protocol, the finite scores of it that share
    one setting (`comparable`), that setting in words and how many finite scores it leaves out."""
    protocol = preferred_protocol(cv, program_ids)
    if protocol is None:
        return None, {}, "", 0
    scores = {pid: s for pid in program_ids if (s := cv.get(pid, {}).get(protocol)) and _finite(s.loss)}
    return protocol, *comparable(scores)


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


def cv_rows(archive: Archive, program_id: int) -> dict[str, list[tuple[str, MetricRow]]]:
    """The held-out experiments of each of a program's CV scores: protocol -> [(fold, row)], by fold."""
    out: dict[str, list[tuple[str, MetricRow]]] = {}
    for e in archive.cv_evaluations(program_id):
        out.setdefault(e.protocol, []).append((e.fold, e.metric_row()))
    return {proto: out[proto] for proto in protocol_order(out)}


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
        },
        "lineage": lineage(archive, program),
        "evaluations": split_rows(archive, program.id),
        # per protocol, the held-out experiments (split "all") with the fold that held each out
        "cv_evaluations": {
            proto: [{"fold": fold, **row.to_json()} for fold, row in rows]
            for proto, rows in cv_rows(archive, program.id).items()
        },
    }


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
    came from: input for `evolve fit`, `eval`, `emit-go` and `run --seeds`."""
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
            f"({len(s.folds)} folds, seed {s.seed}, max-evals {s.max_evals or 'default'}, {s.method})"
        )
    return out


# ---- two programs (diff) ----

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
    full = [p for p in programs if p.stage in ("seed", "full") and _finite(p.val_loss)]
    elapsed = list(itertools.accumulate(g.seconds for g in gens))
    rows, best = [], math.inf
    for i, g in enumerate(gens):
        improved = _finite(g.best_val) and g.best_val < best
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


def show_source(directory: Path | None, ref: str) -> str:
    """`evolve archive show --source`."""
    with opened(directory) as archive:
        return program_file_text(archive, resolve(archive, ref))


def compare_programs(directory: Path | None, a: str, b: str) -> dict:
    """`evolve archive diff`."""
    with opened(directory) as archive:
        return diff(archive, resolve(archive, a), resolve(archive, b))


def run_history(directory: Path | None, every: int | None = None) -> dict:
    """`evolve archive history`."""
    with opened(directory) as archive:
        return generation_history(archive, every)
