"""What the archive and the replays report, as pandas DataFrames for the Python API: program rows
(the `evolve archive list --json` fields, the Pareto front as a boolean column, one CV loss column
per protocol), per-experiment metric rows (flat columns), CV scores and generations (one column
per field of their records)."""

from __future__ import annotations

import dataclasses

import pandas as pd

from stepml_evolve.archive.access import protocol_order
from stepml_evolve.archive.records import CVScoreRecord, GenerationRecord, ProgramRecord
from stepml_evolve.evaluator.scoring.metrics import MetricRow
from stepml_evolve.evolve.browse.listing import select_rows
from stepml_evolve.evolve.deploy.scores import CVScores

METRIC_COLUMNS = (
    "experiment",
    "split",
    "n_requests",
    "observed_e2e_mean_s",
    "observed_ttft_mean_s",
    "observed_itl_mean_ms",
    "predicted_e2e_mean_s",
    "predicted_ttft_mean_s",
    "predicted_itl_mean_ms",
    "ape_e2e",
    "ape_ttft",
    "ape_itl",
    "timeouts_observed",
    "timeouts_predicted",
    "error",
)


def _frame(records: list[dict], columns) -> pd.DataFrame:
    return pd.DataFrame(records) if records else pd.DataFrame(columns=list(columns))


def program_frame(programs: list[ProgramRecord], cv: CVScores) -> pd.DataFrame:
    """Every program (screened ones too, `stage` says which), indexed by id: the fields of
    `evolve archive list --json` with `front` (on the Pareto front of validation loss vs
    complexity) and `cv_<protocol>` (the CV loss, NaN where none) in place of the `cv` dict."""
    protocols = protocol_order(proto for scores in cv.values() for proto in scores)
    records = []
    for row in select_rows(programs, include_screened=True, sort="id", cv=cv):
        record = {}
        for key, value in row.items():
            if key == "cv":
                record.update({f"cv_{p}": (value.get(p) or {}).get("loss") for p in protocols})
            else:
                record[key] = tuple(value) if key == "cell" else value
        records.append(record)
    frame = _frame(records, ["id", "front"])
    for p in protocols:  # a loss JSON-null (no score, or a failed fold) is NaN, as every other loss
        frame[f"cv_{p}"] = frame[f"cv_{p}"].astype(float)
    return frame.set_index("id")


def metric_records(rows: list[MetricRow]) -> list[dict]:
    """Metric rows as flat dicts: METRIC_COLUMNS, and the E2E percentiles (`observed_e2e_p50_s`,
    ...) where the replay computed them."""
    out = []
    for r in rows:
        record = {"experiment": r.name, "split": r.split, "n_requests": r.n_requests}
        for side in ("observed", "predicted"):
            record.update({f"{side}_{k}": v for k, v in dataclasses.asdict(getattr(r, side)).items()})
        record.update({f"ape_{k}": v for k, v in dataclasses.asdict(r.ape).items()})
        record.update(
            {"timeouts_observed": r.timeouts.observed, "timeouts_predicted": r.timeouts.predicted, "error": r.error}
        )
        for side, percentiles in (r.e2e_percentiles_s or {}).items():
            record.update({f"{side}_e2e_{p}_s": v for p, v in percentiles.items()})
        out.append(record)
    return out


def metric_frame(rows: list[MetricRow]) -> pd.DataFrame:
    """One row per experiment (and split)."""
    return _frame(metric_records(rows), METRIC_COLUMNS)


def evaluation_frame(rows_by_program: dict[int, list[MetricRow]]) -> pd.DataFrame:
    """The archived per-experiment rows of each program (validate, test, train), with its `program_id`."""
    records = [{"program_id": pid, **r} for pid, rows in rows_by_program.items() for r in metric_records(rows)]
    return _frame(records, ("program_id", *METRIC_COLUMNS))


def cv_score_frame(scores: list[CVScoreRecord]) -> pd.DataFrame:
    """One row per program and protocol: the CV loss, the held-out APE summary (`e2e_mean`, ...)
    and the settings; `folds` is the number of folds."""
    records = [{**dataclasses.asdict(s), "folds": len(s.folds)} for s in scores]
    return _frame(records, [f.name for f in dataclasses.fields(CVScoreRecord)])


def generation_frame(generations: list[GenerationRecord]) -> pd.DataFrame:
    """One row per completed generation: children, rejections, promotions, best losses, evaluations,
    seconds; `completed` is when it was written, a UTC timestamp (the archive stores epoch seconds)."""
    records = [{k: v for k, v in dataclasses.asdict(g).items() if k != "run_id"} for g in generations]
    frame = _frame(records, [f.name for f in dataclasses.fields(GenerationRecord) if f.name != "run_id"])
    frame["completed"] = pd.to_datetime(frame["completed"], unit="s", utc=True)
    return frame
