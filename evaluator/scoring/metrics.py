"""Per-experiment, per-split metrics of a replay against ground truth, and the loss.

Errors are measured over requests that succeeded in reality (observed client timeouts are
simulated but excluded). A request that succeeded in reality but that the replay timed out
counts with the time the client gave up (its E2E, and its TTFT if no first token came).
ITL per request = (E2E - TTFT) / (output length - 1); means are over requests.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from stepml_evolve.evaluator.data.experiments import ALL, SPLITS, Experiment
from stepml_evolve.evaluator.replay.closed_loop import ReplayResult
from stepml_evolve.evaluator.replay.state import FINISHED, TIMED_OUT

APE_KEYS = {"e2e": "e2e_mean_s", "ttft": "ttft_mean_s", "itl": "itl_mean_ms"}


@dataclass(frozen=True)
class Means:
    """Mean latencies over a split's successful requests (NaN where there are none)."""

    e2e_mean_s: float
    ttft_mean_s: float
    itl_mean_ms: float

    def get(self, key: str) -> float:
        return getattr(self, key)


@dataclass(frozen=True)
class Errors:
    """Absolute percentage errors of the predicted means (NaN where undefined, inf for a failed
    replay; None where read back from an archive, which stores undefined as NULL)."""

    e2e: float | None
    ttft: float | None
    itl: float | None


@dataclass(frozen=True)
class Timeouts:
    observed: int
    predicted: int  # -1 when the replay failed


@dataclass(frozen=True)
class MetricRow:
    """One experiment on one split: observed vs predicted means, their APE, timeouts.

    This is the record `evolve eval --json` prints (`to_json`) and the archive stores (one row of
    its evaluations table); the objectives (objectives.py) and every table and plot read it."""

    name: str
    split: str
    n_requests: int  # successful requests in the split (the ones errors are measured on)
    observed: Means
    predicted: Means
    ape: Errors
    timeouts: Timeouts
    error: str | None = None  # why the replay failed, when it did
    e2e_percentiles_s: dict | None = None  # {"observed": {"p50", "p90", "p99"}, "predicted": {...}} in seconds

    def to_json(self) -> dict:
        """The documented JSON shape (optional keys only where present)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k in ("observed", "predicted", "ape", "timeouts"):
            out[k] = dataclasses.asdict(out[k])
        return {k: v for k, v in out.items() if v is not None or k not in ("e2e_percentiles_s", "error")}


def split_horizon(exp: Experiment, splits) -> int:
    """Arrival positions a replay must cover so every request of `splits` is settled."""
    last = max(len(SPLITS) - 1 if s == ALL else SPLITS.index(s) for s in splits)
    return int(np.searchsorted(exp.split, last, side="right"))


def _ape(pred: float, obs: float) -> float:
    if not (math.isfinite(pred) and math.isfinite(obs)) or obs == 0:
        return math.nan
    return abs(pred - obs) / obs * 100.0


def _means(e2e: np.ndarray, ttft: np.ndarray, out_len: np.ndarray) -> Means:
    if len(e2e) == 0:
        return Means(math.nan, math.nan, math.nan)
    multi = out_len > 1
    itl = (e2e[multi] - ttft[multi]) / (out_len[multi] - 1) * 1e3
    return Means(float(e2e.mean()), float(ttft.mean()), float(itl.mean()) if len(itl) else math.nan)


def predicted_times(exp: Experiment, result: ReplayResult) -> tuple[np.ndarray, np.ndarray]:
    """Predicted (E2E, TTFT) in seconds per request; timed-out ones at the client's limit."""
    limit = exp.abort_after_us / 1e6
    done = result.state == FINISHED
    e2e = np.where(done, result.e2e_us / 1e6, limit)
    ttft = np.where(result.ttft_us >= 0, result.ttft_us / 1e6, limit)
    return e2e, np.minimum(ttft, e2e)


def split_metrics(exp: Experiment, result: ReplayResult, split: str, percentiles: bool = False) -> MetricRow:
    """Observed vs predicted means (and APE in %) for one split of one experiment."""
    in_split = exp.split_mask(split)
    ok = in_split & ~exp.failed
    pe2e, pttft = predicted_times(exp, result)
    observed = _means(exp.e2e_s[ok], exp.ttft_s[ok], exp.output_tokens[ok])
    predicted = _means(pe2e[ok], pttft[ok], exp.output_tokens[ok])
    pct = None
    if percentiles:
        q = [50, 90, 99]
        has = ok.any()
        pct = {
            "observed": {f"p{p}": float(v) for p, v in zip(q, np.percentile(exp.e2e_s[ok], q))} if has else {},
            "predicted": {f"p{p}": float(v) for p, v in zip(q, np.percentile(pe2e[ok], q))} if has else {},
        }
    return MetricRow(
        name=exp.name,
        split=split,
        n_requests=int(ok.sum()),
        observed=observed,
        predicted=predicted,
        ape=Errors(*(_ape(predicted.get(m), observed.get(m)) for m in APE_KEYS.values())),
        timeouts=Timeouts(int((in_split & exp.failed).sum()), int((in_split & (result.state == TIMED_OUT)).sum())),
        e2e_percentiles_s=pct,
    )


def failed_row(exp: Experiment, split: str, reason: str) -> MetricRow:
    """The row of an experiment whose replay failed: predictions NaN, APE infinite."""
    ok = exp.split_mask(split) & ~exp.failed
    return MetricRow(
        name=exp.name,
        split=split,
        n_requests=int(ok.sum()),
        observed=_means(exp.e2e_s[ok], exp.ttft_s[ok], exp.output_tokens[ok]),
        predicted=Means(math.nan, math.nan, math.nan),
        ape=Errors(math.inf, math.inf, math.inf),
        timeouts=Timeouts(int((exp.split_mask(split) & exp.failed).sum()), -1),
        error=reason,
    )


def rms(values) -> float:
    v = np.array([x for x in values if not math.isnan(x)], dtype=float)
    if len(v) == 0:
        return math.nan
    return float(np.sqrt(np.mean(v * v)))
