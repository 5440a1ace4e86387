"""Rendering of metric rows: rich tables for people, NaN-free JSON for scripts."""
from __future__ import annotations

import dataclasses
import json
import math

from rich.table import Table

from evaluator.metrics import MetricRow


def clean(obj):
    """JSON-safe copy: NaN and infinities become null; metric rows in their documented shape."""
    if isinstance(obj, MetricRow):
        return clean(obj.to_json())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return clean(dataclasses.asdict(obj))
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def dumps(obj) -> str:
    return json.dumps(clean(obj), indent=2)


def _f(x, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def metrics_table(rows: list[MetricRow], title: str) -> Table:
    t = Table(title=title)
    for col in ("experiment", "n", "E2E obs s", "E2E pred s", "E2E APE%", "TTFT obs s", "TTFT pred s", "TTFT APE%",
                "ITL obs ms", "ITL pred ms", "ITL APE%", "timeouts obs/pred"):
        t.add_column(col, justify="left" if col == "experiment" else "right")
    for r in rows:
        o, p, a = r.observed, r.predicted, r.ape
        t.add_row(r.name, str(r.n_requests),
                  _f(o.e2e_mean_s, ".3f"), _f(p.e2e_mean_s, ".3f"), _f(a.e2e, ".1f"),
                  _f(o.ttft_mean_s, ".4f"), _f(p.ttft_mean_s, ".4f"), _f(a.ttft, ".1f"),
                  _f(o.itl_mean_ms, ".2f"), _f(p.itl_mean_ms, ".2f"), _f(a.itl, ".1f"),
                  f"{r.timeouts.observed}/{r.timeouts.predicted}")
    return t
