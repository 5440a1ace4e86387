"""The archive's records: one dataclass per table, from which the schema, inserts and readers come.

A field's `column(...)` metadata holds its SQL declaration and how it is stored (JSON text,
integer for a bool); `ddl`, `insert` and `from_row` read those, so a column is declared once.
Fields marked `stored=False` travel with a record but are not columns (e.g. which program of a
generation an LLM call produced, before the program has an id).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepml_evolve.evaluator.data.experiments import ALL
from stepml_evolve.evaluator.scoring.metrics import Errors, Means, MetricRow, Timeouts


def column(
    sql: str,
    *,
    json_text: bool = False,
    sort_keys: bool = False,
    boolean: bool = False,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
):
    """A dataclass field that is a table column declared as `sql`."""
    meta = {"sql": sql, "json": json_text, "sort_keys": sort_keys, "bool": boolean}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def transient(default: Any = None):
    """A field carried with a record but not stored."""
    return field(default=default, metadata={"stored": False}, compare=False)


def _columns(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("stored", True)]


def column_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in _columns(cls))


def ddl(cls, table: str, constraints: str = "") -> str:
    cols = [f"{f.name} {f.metadata['sql']}" for f in _columns(cls)]
    return f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(cols + ([constraints] if constraints else []))});"


def _to_db(f: dataclasses.Field, value: Any) -> Any:
    if f.metadata["json"]:
        return None if value is None else json.dumps(value, sort_keys=f.metadata["sort_keys"])
    if f.metadata["bool"]:
        return int(value)
    return value


def _from_db(f: dataclasses.Field, value: Any) -> Any:
    if f.metadata["json"]:
        return None if value is None else json.loads(value)
    if f.metadata["bool"]:
        return bool(value)
    return value


def encode(cls, name: str, value: Any) -> Any:
    """`value` as column `name` of `cls` stores it (for a single-column UPDATE)."""
    return _to_db(next(f for f in _columns(cls) if f.name == name), value)


def insert(db: sqlite3.Connection, table: str, record) -> int:
    """Insert `record`; an `id` of None lets SQLite assign it. Returns the row id."""
    cols = [f for f in _columns(type(record)) if not (f.name == "id" and record.id is None)]
    cur = db.execute(
        f"INSERT INTO {table} ({', '.join(f.name for f in cols)}) VALUES ({', '.join('?' * len(cols))})",
        tuple(_to_db(f, getattr(record, f.name)) for f in cols),
    )
    return int(cur.lastrowid)


def select(db: sqlite3.Connection, cls, table: str, where: str = "", args: tuple = (), order: str = "") -> list:
    names = column_names(cls)
    q = (
        f"SELECT {', '.join(names)} FROM {table}"
        + (f" WHERE {where}" if where else "")
        + (f" ORDER BY {order}" if order else "")
    )
    cols = _columns(cls)
    return [cls(**{f.name: _from_db(f, v) for f, v in zip(cols, row)}) for row in db.execute(q, args)]


@dataclass
class RunRecord:
    id: int | None = column("INTEGER PRIMARY KEY")
    created: float = column("REAL NOT NULL", default=0.0)
    data_label: str = column("TEXT NOT NULL", default="")
    data_fingerprint: str = column("TEXT NOT NULL", default="")
    synthetic: bool = column("INTEGER NOT NULL", boolean=True, default=False)
    seed: int = column("INTEGER NOT NULL", default=0)
    config: dict = column("TEXT NOT NULL", json_text=True, sort_keys=True, default_factory=dict)
    summary: dict | None = column("TEXT", json_text=True, sort_keys=True, default=None)


@dataclass
class ProgramRecord:
    """A program of a run: source with its fitted constants, lineage, descriptors and losses."""

    id: int | None = column("INTEGER PRIMARY KEY")
    run_id: int = column("INTEGER NOT NULL REFERENCES runs(id)", default=0)
    generation: int = column("INTEGER NOT NULL", default=0)
    source_hash: str = column("TEXT NOT NULL", default="")
    source: str = column("TEXT NOT NULL", default="")
    constants: dict = column("TEXT NOT NULL", json_text=True, default_factory=dict)
    parents: list = column("TEXT NOT NULL", json_text=True, default_factory=list)
    operator: str = column("TEXT NOT NULL", default="")
    operator_detail: str = column("TEXT NOT NULL DEFAULT ''", default="")
    island: int = column("INTEGER NOT NULL DEFAULT 0", default=0)
    complexity: int = column("INTEGER NOT NULL", default=0)
    n_components: int = column("INTEGER NOT NULL", default=0)
    components: list = column("TEXT NOT NULL", json_text=True, default_factory=list)
    quick_loss: float | None = column("REAL", default=None)
    screen_loss: float | None = column("REAL", default=None)
    train_loss: float | None = column("REAL", default=None)
    val_loss: float | None = column("REAL", default=None)
    test_loss: float | None = column("REAL", default=None)
    stage: str = column("TEXT NOT NULL", default="screened")  # "seed", "screened" (quick fit only) or "full"

    @property
    def full(self) -> bool:
        return self.stage in ("seed", "full") and self.val_loss is not None


def seed_ancestor(program: ProgramRecord, lookup: Callable[[int], ProgramRecord | None]) -> ProgramRecord:
    """The seed a program descends from: its first parents followed back through `lookup` (id ->
    record, None where the archive has none), itself for a seed, the oldest ancestor found when the
    chain leaves what `lookup` holds."""
    root = program
    while root.operator != "seed" and root.parents and (up := lookup(root.parents[0])) is not None:
        root = up
    return root


def refit_of(programs: list[ProgramRecord]) -> dict[int, int]:
    """The programs that are a refit of an older one of theirs: the same structure (source_hash:
    the functions, the constants' names, bounds and priors, not their values) -> the oldest program
    of that structure. A `constants` child is one by design; a refit that scores better has found
    better constants for a structure the run already held, not a mechanism it lacked."""
    first: dict[str, int] = {}
    out: dict[int, int] = {}
    for p in sorted(programs, key=lambda p: p.id or 0):
        if not p.source_hash or p.id is None:
            continue
        if p.source_hash in first:
            out[p.id] = first[p.source_hash]
        else:
            first[p.source_hash] = p.id
    return out


def _finite_or_none(x):
    return x if isinstance(x, (int, float)) and x == x and x not in (math.inf, -math.inf) else None


@dataclass
class EvaluationRecord:
    """A MetricRow as the evaluations table holds it (undefined APE stored as NULL)."""

    program_id: int = column("INTEGER NOT NULL REFERENCES programs(id)")
    experiment: str = column("TEXT NOT NULL")
    split: str = column("TEXT NOT NULL")
    n_requests: int = column("INTEGER NOT NULL")
    observed: dict = column("TEXT NOT NULL", json_text=True)
    predicted: dict = column("TEXT NOT NULL", json_text=True)
    ape_e2e: float | None = column("REAL")
    ape_ttft: float | None = column("REAL")
    ape_itl: float | None = column("REAL")
    timeouts_observed: int | None = column("INTEGER")
    timeouts_predicted: int | None = column("INTEGER")
    extra: dict | None = column("TEXT", json_text=True)  # e2e_percentiles_s and error, when present

    @classmethod
    def of(cls, program_id: int, row: MetricRow) -> EvaluationRecord:
        extra = {k: v for k, v in (("e2e_percentiles_s", row.e2e_percentiles_s), ("error", row.error)) if v is not None}
        return cls(
            program_id,
            row.name,
            row.split,
            row.n_requests,
            dataclasses.asdict(row.observed),
            dataclasses.asdict(row.predicted),
            _finite_or_none(row.ape.e2e),
            _finite_or_none(row.ape.ttft),
            _finite_or_none(row.ape.itl),
            row.timeouts.observed,
            row.timeouts.predicted,
            extra or None,
        )

    def metric_row(self) -> MetricRow:
        extra = self.extra or {}
        return MetricRow(
            name=self.experiment,
            split=self.split,
            n_requests=self.n_requests,
            observed=Means(**self.observed),
            predicted=Means(**self.predicted),
            ape=Errors(self.ape_e2e, self.ape_ttft, self.ape_itl),
            timeouts=Timeouts(self.timeouts_observed, self.timeouts_predicted),
            error=extra.get("error"),
            e2e_percentiles_s=extra.get("e2e_percentiles_s"),
        )


@dataclass
class RejectionRecord:
    """A child that never became a program, and why (`rule` names the check that failed)."""

    id: int | None = column("INTEGER PRIMARY KEY", default=None)
    run_id: int = column("INTEGER NOT NULL", default=0)
    generation: int = column("INTEGER NOT NULL", default=0)
    operator: str = column("TEXT NOT NULL", default="")
    parents: list = column("TEXT NOT NULL", json_text=True, default_factory=list)
    rule: str = column("TEXT NOT NULL", default="")
    reason: str = column("TEXT NOT NULL", default="")
    source: str | None = column("TEXT", default=None)


@dataclass
class LLMCallRecord:
    """One LLM request attempt: tokens, cost, latency, outcome, and the program it produced."""

    id: int | None = column("INTEGER PRIMARY KEY", default=None)
    run_id: int = column("INTEGER NOT NULL", default=0)
    generation: int = column("INTEGER NOT NULL", default=0)
    model: str = column("TEXT NOT NULL", default="")
    request_hash: str = column("TEXT NOT NULL", default="")
    prompt_tokens: int = column("INTEGER NOT NULL", default=0)
    completion_tokens: int = column("INTEGER NOT NULL", default=0)
    cost_usd: float = column("REAL NOT NULL", default=0.0)
    latency_s: float = column("REAL NOT NULL", default=0.0)
    outcome: str = column("TEXT NOT NULL", default="ok")
    error: str | None = column("TEXT", default=None)
    cached: bool = column("INTEGER NOT NULL", boolean=True, default=False)
    program_id: int | None = column("INTEGER", default=None)
    program_index: int | None = transient()  # which program of its generation, before ids exist


@dataclass
class GenerationRecord:
    """A completed generation: its row is written last, in the same transaction as its programs."""

    run_id: int = column("INTEGER NOT NULL", default=0)
    generation: int = column("INTEGER NOT NULL", default=0)
    completed: float = column("REAL NOT NULL", default=0.0)  # wall-clock time (s since the epoch)
    seconds: float = column("REAL NOT NULL", default=0.0)
    n_children: int = column("INTEGER NOT NULL", default=0)
    n_rejected: int = column("INTEGER NOT NULL", default=0)
    n_promoted: int = column("INTEGER NOT NULL", default=0)
    best_train: float | None = column("REAL", default=None)
    best_val: float | None = column("REAL", default=None)
    evaluations: int = column("INTEGER NOT NULL", default=0)


def generation_pace(gens: list[GenerationRecord]) -> tuple[float | None, float | None, float | None]:
    """A run's pace from its generations: generation 0's seconds, the mean seconds of a generation
    after it, and those generations per hour (None where there is no such generation)."""
    zero = [g.seconds for g in gens if g.generation == 0]
    later = [g.seconds for g in gens if g.generation > 0]
    total = sum(later)
    return (
        zero[0] if zero else None,
        total / len(later) if later else None,
        3600 * len(later) / total if later and total > 0 else None,
    )


CV_METRICS = ("e2e", "ttft", "itl")  # the summary columns of a CV score: <metric>_mean, _median, _max (APE %)
CV_STATS = ("mean", "median", "max")


def _number_or_none(x) -> float | None:
    """A float as a REAL column holds it: NaN (no number) as NULL, infinities kept (a failed replay)."""
    return None if x is None or x != x else float(x)


WARM_SUFFIX = "-warm"  # a CV score's method when its folds were warm-started (the search's --cv-fit-evals)


@dataclass
class CVScoreRecord:
    """A program's cross-validation under one protocol (one row per program and protocol; a new
    score of the same protocol replaces it): the CV loss (the fit's objective over every fold's
    held-out experiments), the held-out APE summary, and the settings that produced it."""

    program_id: int = column("INTEGER NOT NULL REFERENCES programs(id)")
    protocol: str = column("TEXT NOT NULL")  # lomo, lowo, groups:FILE
    loss: float | None = column("REAL", default=None)  # infinite when a held-out replay failed
    e2e_mean: float | None = column("REAL", default=None)
    e2e_median: float | None = column("REAL", default=None)
    e2e_max: float | None = column("REAL", default=None)
    ttft_mean: float | None = column("REAL", default=None)
    ttft_median: float | None = column("REAL", default=None)
    ttft_max: float | None = column("REAL", default=None)
    itl_mean: float | None = column("REAL", default=None)
    itl_median: float | None = column("REAL", default=None)
    itl_max: float | None = column("REAL", default=None)
    seed: int = column("INTEGER NOT NULL", default=0)  # the fold fits' seed
    max_evals: int | None = column("INTEGER", default=None)  # per fold fit; NULL: the method's default
    method: str = column("TEXT NOT NULL", default="")
    objective: str = column("TEXT NOT NULL", default="rms")
    weights: list = column("TEXT NOT NULL", json_text=True, default_factory=list)  # [[pattern, weight], ...]
    semantics: str = column("TEXT NOT NULL", default="")
    # per fold: name, train, held_out, constants, train_loss, evaluations
    folds: list = column("TEXT NOT NULL", json_text=True, default_factory=list)
    evaluations: int = column("INTEGER NOT NULL", default=0)  # closed-loop evaluations of every fold fit
    seconds: float = column("REAL NOT NULL", default=0.0)
    created: float = column("REAL NOT NULL", default=0.0)  # wall-clock time (s since the epoch)

    def settings(self) -> dict:
        """What makes two scores of a protocol comparable: a score with the same settings is not redone."""
        return {
            "seed": self.seed,
            "max_evals": self.max_evals,
            "method": self.method,
            "objective": self.objective,
            "weights": [list(w) for w in self.weights],
            "semantics": self.semantics,
        }

    def summary(self) -> dict[str, dict[str, float | None]]:
        """{"e2e": {"mean", "median", "max"}, "ttft": ..., "itl": ...}: APE % over the held-out experiments."""
        return {m: {s: getattr(self, f"{m}_{s}") for s in CV_STATS} for m in CV_METRICS}

    def to_json(self) -> dict:
        """A program's `cv` entry for this protocol (list/show/pareto --json)."""
        return {
            "loss": self.loss,
            **self.summary(),
            "seed": self.seed,
            "max_evals": self.max_evals,
            "method": self.method,
            "objective": self.objective,
            "semantics": self.semantics,
            "folds": len(self.folds),
            "created": self.created,
        }

    @classmethod
    def of(
        cls, program_id: int, cv, config, semantics: str, seconds: float = 0.0, created: float = 0.0
    ) -> CVScoreRecord:
        """From an evaluator.crossval.CrossValidation made with fit settings `config` (a FitConfig)."""
        summary = cv.summary()
        stats = {f"{m}_{s}": _number_or_none((summary.get(m) or {}).get(s)) for m in CV_METRICS for s in CV_STATS}
        folds = [
            {
                "name": f.fold.name,
                "train": list(f.fold.train),
                "held_out": list(f.fold.held_out),
                "constants": f.constants,
                "train_loss": _finite_or_none(f.fit.loss),
                "evaluations": f.fit.evaluations,
            }
            for f in cv.folds
        ]
        return cls(
            program_id=program_id,
            protocol=cv.protocol,
            loss=_number_or_none(cv.loss),
            **stats,
            seed=config.seed,
            max_evals=config.max_evals,
            method=config.method + (WARM_SUFFIX if cv.warm_started else ""),
            objective=config.objective.name,
            weights=[list(w) for w in config.objective.weights],
            semantics=semantics,
            folds=folds,
            evaluations=sum(f.fit.evaluations for f in cv.folds),
            seconds=seconds,
            created=created,
        )


@dataclass
class CVEvaluationRecord(EvaluationRecord):
    """A held-out experiment of a CV score: scored on all its requests (split "all") with its fold's constants."""

    protocol: str = column("TEXT NOT NULL")
    fold: str = column("TEXT NOT NULL")

    @classmethod
    def of(cls, program_id: int, protocol: str, fold: str, row: MetricRow) -> CVEvaluationRecord:
        e = EvaluationRecord.of(program_id, dataclasses.replace(row, split=ALL))
        return cls(**{f.name: getattr(e, f.name) for f in dataclasses.fields(e)}, protocol=protocol, fold=fold)


@dataclass
class NewProgram:
    """A program of the generation being written, with its per-experiment rows (none if screened only)."""

    record: ProgramRecord
    evaluations: list[MetricRow] = field(default_factory=list)
    cv: CVScoreRecord | None = None  # the CV score its full fit made (`evolve run --cv`), stored with it
    cv_rows: list[CVEvaluationRecord] = field(default_factory=list)


@dataclass
class ExplanationRecord:
    """Where a program's error grows and which terms the screening found on its residuals
    (evaluator/discovery), as `evolve explain` shows them: one row per program and split. A run
    stores its best program's and its deployed one's at its end, for the report."""

    program_id: int = column("INTEGER NOT NULL REFERENCES programs(id)")
    split: str = column("TEXT NOT NULL", default="train")
    requests: int = column("INTEGER NOT NULL", default=0)  # measured requests the residuals cover
    # [{latency, feature, strength, kind, bins: [{range, error_pct, requests}]}, ...], strongest first
    associations: list = column("TEXT NOT NULL", json_text=True, default_factory=list)
    # {candidates, passed, false_passes_by_chance, terms: [{term, family, coefficient, gain, chance, held_out, passed}]}
    screening: dict = column("TEXT NOT NULL", json_text=True, default_factory=dict)
    created: float = column("REAL NOT NULL", default=0.0)  # wall-clock time (s since the epoch)
