"""Where a fitted program's error grows: its per-request errors against what each request lived
through on the program's own schedule (residuals.py), and against the experiment's model, TP
degree and workload.

A request's features are read off its lifetime: the mean, over the steps of its E2E, of the
step's longest context, its batch (scheduled requests), its prefill chunk (prefill tokens) and its
decode share (decode requests over scheduled ones), with the request's own prompt and output
lengths. For each latency (E2E, TTFT) and feature, the association's strength is Spearman's rank
correlation of the error with the feature over every measured request (for the model, TP and
workload: the share of the error's variance their means explain, eta squared), and its bins are the
mean error of the requests in each quartile of the feature (each level). The error is the
program's signed error, (predicted - observed) / the split's observed mean, in percent: negative
where the program is too fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .residuals import E2E, TTFT, RequestResiduals

LATENCIES = {"E2E": E2E, "TTFT": TTFT}
LIFETIME = {  # a request's lifetime mean of a step's value: name -> (numerator column, denominator column)
    "context (tokens)": ("ctx_max", None),
    "batch (requests)": ("n_req", None),
    "prefill chunk (tokens)": ("tok_pf", None),
    "decode share": ("n_dc", "n_req"),
}
LEVELS = ("model", "tp", "workload")


@dataclass
class Association:
    """How one latency's error goes with one feature: strength, and (label, mean error %, requests) bins."""

    latency: str
    feature: str
    strength: float  # Spearman's rho (a number), or eta squared (a level)
    bins: list[tuple[str, float, int]]
    kind: str  # "rank" or "level"

    def line(self) -> str:
        what = f"rho {self.strength:+.2f}" if self.kind == "rank" else f"eta^2 {self.strength:.2f}"
        bins = ", ".join(f"{label}: {err:+.1f} %" for label, err, _ in self.bins)
        return f"{self.latency} error by {self.feature} ({what}): {bins}"


def _features(residuals: list[RequestResiduals]) -> dict[str, list[np.ndarray]]:
    """Per feature, each experiment's per-request values."""
    out: dict[str, list[np.ndarray]] = {"prompt (tokens)": [], "output (tokens)": []}
    out.update({name: [] for name in LIFETIME})
    for r in residuals:
        out["prompt (tokens)"].append(r.input_tokens)
        out["output (tokens)"].append(r.output_tokens)
        ones = r.sums(np.ones(r.n_steps))[E2E, :, 0] * r.scale[E2E]
        ones_ttft = r.sums(np.ones(r.n_steps))[TTFT, :, 0] * r.scale[TTFT]
        steps = np.where(r.finished, ones, ones_ttft)  # the E2E's steps, or the TTFT's where E2E is not measured
        for name, (num, den) in LIFETIME.items():
            value = r.column(num)
            if den is not None:
                value = np.divide(value, r.column(den), out=np.zeros(r.n_steps), where=r.column(den) > 0)
            sums = r.sums(value)[:, :, 0] * r.scale[:, None]
            total = np.where(r.finished, sums[E2E], sums[TTFT])
            out[name].append(np.where(steps > 0, total / np.where(steps > 0, steps, 1.0), np.nan))
    return out


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return 0.0
    rx = np.argsort(np.argsort(x[ok])).astype(float)
    ry = np.argsort(np.argsort(y[ok])).astype(float)
    return float(np.corrcoef(rx, ry)[0, 1])


def _quartile_bins(x: np.ndarray, y: np.ndarray) -> list[tuple[str, float, int]]:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if not len(x):
        return []
    edges = np.unique(np.quantile(x, [0, 0.25, 0.5, 0.75, 1.0]))
    if len(edges) < 2:
        return [(f"{edges[0]:.4g}", float(y.mean()), len(y))]
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    return [
        (f"{edges[i]:.4g}-{edges[i + 1]:.4g}", float(y[which == i].mean()), int((which == i).sum()))
        for i in range(len(edges) - 1)
        if (which == i).any()
    ]


def _eta_squared(labels: np.ndarray, y: np.ndarray) -> tuple[float, list[tuple[str, float, int]]]:
    total = ((y - y.mean()) ** 2).sum()
    bins, between = [], 0.0
    for level in sorted(set(labels.tolist())):
        inside = labels == level
        m = float(y[inside].mean())
        between += inside.sum() * (m - y.mean()) ** 2
        bins.append((str(level), m, int(inside.sum())))
    return (float(between / total) if total > 0 else 0.0), bins


def explain(residuals: list[RequestResiduals]) -> list[Association]:
    """Every latency x feature association, strongest first."""
    features = _features(residuals)
    out = []
    for latency, row in LATENCIES.items():
        errors = [-r.residual[row] * 100 for r in residuals]
        measured = [r.finished if row == E2E else np.ones(r.n, bool) for r in residuals]
        y = np.concatenate([e[m] for e, m in zip(errors, measured)])
        if not len(y):
            continue
        for name, per_exp in features.items():
            x = np.concatenate([v[m] for v, m in zip(per_exp, measured)])
            out.append(Association(latency, name, _spearman(x, y), _quartile_bins(x, y), "rank"))
        for level in LEVELS:
            labels = np.concatenate(
                [np.full(m.sum(), getattr(r, level), dtype=object) for r, m in zip(residuals, measured)]
            )
            eta, bins = _eta_squared(labels, y)
            out.append(Association(latency, level, eta, bins, "level"))
    out.sort(key=lambda a: -abs(a.strength))
    return out


def residual_summary(associations: list[Association], top: int = 4) -> str:
    """The strongest associations, one line each (the LLM prompt's residual summary)."""
    return "\n".join(a.line() for a in associations[:top])
