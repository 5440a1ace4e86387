"""The self-contained HTML report of a search: context from the archive, plots as inline SVG.

Owns: the run summary (operators, rejections, LLM usage), the five plots (Pareto front, best
loss per generation, MAP-Elites grid, the best program's predicted vs observed means and E2E
percentiles on the test split) drawn here as plain SVG markup, the cross-validation table (CV
scores where `evolve archive cv` or the search stored them), and rendering the page with the
jinja2 template `evolve/browse/templates/report.html.j2`. The page needs no network and no script.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from importlib.resources import files

import jinja2
from markupsafe import Markup, escape

from stepml_evolve.archive.access import operator_label, protocol_order, run_programs, split_rows
from stepml_evolve.archive.map_elites import (
    COMPLEXITY_BIN,
    MAX_COMPLEXITY_BIN,
    best,
    cell_label,
    elites,
    pareto_front,
    scored,
)
from stepml_evolve.archive.records import GenerationRecord, RunRecord
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.numbers import finite, fmt
from stepml_evolve.evaluator.scoring.metrics import MetricRow
from stepml_evolve.evolve.deploy.rules import DEFAULT_RULE, choose
from stepml_evolve.evolve.deploy.scores import cv_by_program, ranked_cv

from .listing import select_rows

OBSERVED = "#3b3b3b"
PREDICTED = "#e66101"
TRAIN = "#1b9e77"
VALIDATE = "#5e3c99"
FRONT = "#d7191c"
MUTED = "#9aa4ad"
# viridis stops, dark first: the lowest (best) loss is the darkest cell
RAMP = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")


# ---- scales ----


@dataclass
class Scale:
    """Maps a data interval onto pixels, linearly or in log10."""

    lo: float
    hi: float
    start: float
    end: float
    log: bool = False

    @classmethod
    def fit(cls, values: list[float], start: float, end: float, log: bool = False, pad: float = 0.05) -> Scale:
        vals = [v for v in values if finite(v) and (v > 0 or not log)]
        if not vals:
            vals = [1.0]
        lo, hi = min(vals), max(vals)
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        span = hi - lo or (abs(hi) * 0.5 or 1.0)
        lo, hi = lo - span * pad, hi + span * pad
        return cls(10**lo if log else lo, 10**hi if log else hi, start, end, log)

    def _t(self, v: float) -> float:
        if self.log:
            v = math.log10(max(v, 1e-300))
            return (v - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def __call__(self, v: float) -> float:
        return round(self.start + self._t(v) * (self.end - self.start), 2)

    def ticks(self) -> list[float]:
        if self.log:
            return _log_ticks(self.lo, self.hi)
        step = _nice_step((self.hi - self.lo) / 5)
        first = math.ceil(self.lo / step) * step
        return [round(first + i * step, 10) for i in range(int((self.hi - first) / step) + 1)]


def _nice_step(raw: float) -> float:
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _log_ticks(lo: float, hi: float) -> list[float]:
    decades = math.log10(hi) - math.log10(lo)
    mantissas = (1,) if decades > 3 else (1, 2, 5) if decades > 0.8 else (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)
    out = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        out += [m * 10**e for m in mantissas if lo <= m * 10**e <= hi]
    if len(out) < 3:  # a narrow range: evenly spaced values read better than one lonely decade mark
        step = _nice_step((hi - lo) / 4)
        out = [round(k * step, 10) for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]
    return out


# ---- SVG primitives (strings; every text goes through escape) ----


def _svg(width: int, height: int, label: str, body: list[str]) -> Markup:
    return Markup(
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(label)}" font-family="system-ui, sans-serif" font-size="11">'
        + "".join(body)
        + "</svg>"
    )


def _text(x: float, y: float, s: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x}" y="{y}" text-anchor="{anchor}" {extra}>{escape(s)}</text>'


def _title(s: str) -> str:
    return f"<title>{escape(s)}</title>"


def _empty(label: str, message: str) -> Markup:
    return _svg(480, 60, label, [_text(10, 34, message, extra='fill="#666"')])


@dataclass
class Box:
    left: float
    top: float
    right: float
    bottom: float


def _axes(box: Box, xs: Scale, ys: Scale, xlabel: str, ylabel: str) -> list[str]:
    out = [
        f'<rect x="{box.left}" y="{box.top}" width="{box.right - box.left}" height="{box.bottom - box.top}" fill="none" stroke="#ccc"/>'
    ]
    for t in xs.ticks():
        x = xs(t)
        out.append(f'<line x1="{x}" y1="{box.top}" x2="{x}" y2="{box.bottom}" stroke="#eee"/>')
        out.append(_text(x, box.bottom + 14, fmt(t), "middle"))
    for t in ys.ticks():
        y = ys(t)
        out.append(f'<line x1="{box.left}" y1="{y}" x2="{box.right}" y2="{y}" stroke="#eee"/>')
        out.append(_text(box.left - 5, y + 4, fmt(t), "end"))
    out.append(_text((box.left + box.right) / 2, box.bottom + 32, xlabel, "middle", 'font-size="12"'))
    cy = (box.top + box.bottom) / 2
    out.append(_text(14, cy, ylabel, "middle", f'font-size="12" transform="rotate(-90 14 {cy})"'))
    return out


def _legend(x: float, y: float, items: list[tuple[str, str]]) -> list[str]:
    out = []
    for i, (color, label) in enumerate(items):
        yy = y + i * 15
        out.append(f'<rect x="{x}" y="{yy - 8}" width="10" height="10" fill="{color}"/>')
        out.append(_text(x + 14, yy + 1, label))
    return out


def _link(pid: int, inner: str) -> str:
    return f'<a href="#p{pid}">{inner}</a>'


# ---- the plots ----


def pareto_svg(programs) -> Markup:
    """Validation loss (log) vs complexity for every fully evaluated program; the front highlighted."""
    label = "Pareto front: validation loss vs complexity"
    pts = scored(programs)
    if not pts:
        return _empty(label, "no fully evaluated program yet")
    front = pareto_front(programs)
    front_ids = {p.id for p in front}
    W, H = 760, 400
    box = Box(70, 15, W - 150, H - 45)
    xs = Scale.fit([p.complexity for p in pts], box.left, box.right)
    ys = Scale.fit([p.val_loss for p in pts], box.bottom, box.top, log=True)
    body = _axes(box, xs, ys, "complexity (AST nodes)", "validation loss (log)")
    for p in pts:
        if p.id not in front_ids:
            tip = _title(f"#{p.id} {operator_label(p)}: val {fmt(p.val_loss)}, complexity {p.complexity}")
            body.append(
                _link(
                    p.id,
                    f'<circle cx="{xs(p.complexity)}" cy="{ys(p.val_loss)}" r="3.5" fill="{MUTED}" '
                    f'fill-opacity="0.7">{tip}</circle>',
                )
            )
    # the front as an attainment staircase: each member holds until a more complex one improves on it
    stairs = []
    for i, p in enumerate(front):
        stairs.append(f"{xs(p.complexity)},{ys(p.val_loss)}")
        nxt = front[i + 1].complexity if i + 1 < len(front) else None
        if nxt is not None:
            stairs.append(f"{xs(nxt)},{ys(p.val_loss)}")
    body.append(
        f'<polyline points="{" ".join(stairs)}" fill="none" stroke="{FRONT}" stroke-width="1.5" stroke-dasharray="4 3"/>'
    )
    for p in front:
        tip = _title(f"#{p.id} {operator_label(p)}: val {fmt(p.val_loss)}, complexity {p.complexity} (front)")
        x, y = xs(p.complexity), ys(p.val_loss)
        body.append(
            _link(
                p.id,
                f'<circle cx="{x}" cy="{y}" r="5" fill="{FRONT}">{tip}</circle>'
                + _text(x + 7, y - 6, f"#{p.id}", extra=f'fill="{FRONT}"'),
            )
        )
    body += _legend(
        box.right + 15,
        box.top + 10,
        [(FRONT, f"Pareto front ({len(front)})"), (MUTED, f"other programs ({len(pts) - len(front)})")],
    )
    return _svg(W, H, label, body)


def history_svg(generations: list[GenerationRecord]) -> Markup:
    """Best train and best validation loss after each generation (log y)."""
    label = "best loss over generations"
    series = [("best_train", TRAIN, "best train loss"), ("best_val", VALIDATE, "best validation loss")]
    values = [v for g in generations for k, _, _ in series if finite(v := getattr(g, k)) and v > 0]
    if not values:
        return _empty(label, "no completed generation yet")
    W, H = 760, 320
    box = Box(70, 15, W - 170, H - 45)
    xs = Scale.fit([g.generation for g in generations], box.left, box.right, pad=0.02)
    ys = Scale.fit(values, box.bottom, box.top, log=True)
    body = _axes(box, xs, ys, "generation", "loss (log)")
    for key, color, name in series:
        pts = [(g.generation, v) for g in generations if finite(v := getattr(g, key)) and v > 0]
        # a step line: the best so far holds until the generation that improves on it
        path = []
        for i, (gen, v) in enumerate(pts):
            if i:
                path.append(f"{xs(gen)},{ys(pts[i - 1][1])}")
            path.append(f"{xs(gen)},{ys(v)}")
        body.append(f'<polyline points="{" ".join(path)}" fill="none" stroke="{color}" stroke-width="2"/>')
        for gen, v in pts:
            body.append(
                f'<circle cx="{xs(gen)}" cy="{ys(v)}" r="2.5" fill="{color}">{_title(f"generation {gen}: {name} {fmt(v)}")}</circle>'
            )
    body += _legend(box.right + 15, box.top + 10, [(c, n) for _, c, n in series])
    return _svg(W, H, label, body)


def _ramp(t: float) -> str:
    """Color for t in [0, 1] along RAMP (0 = lowest loss)."""
    t = min(max(t, 0.0), 1.0) * (len(RAMP) - 1)
    i = min(int(t), len(RAMP) - 2)
    f = t - i
    a, b = (tuple(int(c[k : k + 2], 16) for k in (1, 3, 5)) for c in (RAMP[i], RAMP[i + 1]))
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))


def grid_svg(programs) -> Markup:
    """MAP-Elites grid: complexity bin x number of components, colored by the elite's validation loss."""
    label = "MAP-Elites grid"
    grid = elites(programs)
    if not grid:
        return _empty(label, "no cell has an elite yet")
    bins = range(min(c for c, _ in grid), max(c for c, _ in grid) + 1)
    comps = range(min(n for _, n in grid), max(n for _, n in grid) + 1)
    cw, ch = max(34, min(70, 600 // len(bins))), 26
    left, top = 60, 15
    W = left + cw * len(bins) + 140
    H = top + ch * len(comps) + 60
    logs = [math.log10(p.val_loss) for p in grid.values() if p.val_loss > 0]
    lo, hi = min(logs), max(logs)
    body = []
    for j, n in enumerate(reversed(comps)):
        y = top + j * ch
        body.append(_text(left - 6, y + ch / 2 + 4, str(n), "end"))
        for i, c in enumerate(bins):
            x = left + i * cw
            p = grid.get((c, n))
            if p is None:
                body.append(f'<rect x="{x}" y="{y}" width="{cw - 1}" height="{ch - 1}" fill="#f3f3f3"/>')
                continue
            t = (math.log10(p.val_loss) - lo) / (hi - lo) if hi > lo and p.val_loss > 0 else 0.0
            fill = _ramp(t)
            ink = "#fff" if t < 0.6 else "#111"
            tip = _title(f"{cell_label((c, n))}: elite #{p.id}, val loss {fmt(p.val_loss)}")
            body.append(
                _link(
                    p.id,
                    f'<rect x="{x}" y="{y}" width="{cw - 1}" height="{ch - 1}" fill="{fill}">{tip}</rect>'
                    + _text(x + cw / 2, y + ch / 2 + 4, f"#{p.id}", "middle", f'fill="{ink}" font-size="10"'),
                )
            )
    for i, c in enumerate(bins):
        lo_c = c * COMPLEXITY_BIN
        tick = f"{lo_c}+" if c == MAX_COMPLEXITY_BIN else str(lo_c)
        body.append(_text(left + i * cw + cw / 2, top + ch * len(comps) + 14, tick, "middle"))
    body.append(
        _text(
            left + cw * len(bins) / 2,
            top + ch * len(comps) + 34,
            f"complexity bin (lower bound, {COMPLEXITY_BIN} nodes per bin)",
            "middle",
            'font-size="12"',
        )
    )
    cy = top + ch * len(comps) / 2
    body.append(_text(14, cy, "components", "middle", f'font-size="12" transform="rotate(-90 14 {cy})"'))
    body += _colorbar(left + cw * len(bins) + 25, top, 10**lo, 10**hi)
    return _svg(W, H, label, body)


def _colorbar(x: float, y: float, lo: float, hi: float) -> list[str]:
    stops = "".join(f'<stop offset="{i / (len(RAMP) - 1)}" stop-color="{c}"/>' for i, c in enumerate(RAMP))
    return [
        f'<defs><linearGradient id="loss-ramp" x1="0" y1="0" x2="0" y2="1">{stops}</linearGradient></defs>',
        f'<rect x="{x}" y="{y}" width="14" height="120" fill="url(#loss-ramp)"/>',
        _text(x + 20, y + 9, f"{fmt(lo)} (best)"),
        _text(x + 20, y + 120, fmt(hi)),
        _text(x, y + 140, "validation loss (log)"),
    ]


def _row_layout(names: list[str], row_h: int, width: int = 760) -> tuple[Box, int]:
    """Plot box for one row per experiment (names on the left, a note on the right) and the SVG height."""
    left = min(320, 20 + 6.2 * max(len(n) for n in names))
    box = Box(left, 10, width - 130, 10 + row_h * len(names))
    return box, int(box.bottom + 62)


def _row_axes(box: Box, xs: Scale, xlabel: str, names: list[str], row_h: int) -> list[str]:
    out = []
    for t in xs.ticks():
        out.append(f'<line x1="{xs(t)}" y1="{box.top}" x2="{xs(t)}" y2="{box.bottom}" stroke="#eee"/>')
        out.append(_text(xs(t), box.bottom + 14, fmt(t), "middle"))
    for i, n in enumerate(names):
        out.append(_text(box.left - 8, box.top + i * row_h + row_h / 2 + 4, n, "end"))
    out.append(f'<line x1="{box.left}" y1="{box.bottom}" x2="{box.right}" y2="{box.bottom}" stroke="#999"/>')
    out.append(_text((box.left + box.right) / 2, box.bottom + 32, xlabel, "middle", 'font-size="12"'))
    return out


def _diamond(x: float, y: float, color: str, r: float = 6) -> str:
    return f'<path d="M{x},{y - r} l{r},{r} l-{r},{r} l-{r},-{r} z" fill="{color}"/>'


def _observed_predicted_legend(x: float, y: float, predicted_marker: bool) -> list[str]:
    mark = (
        _diamond(x + 95, y - 4, PREDICTED)
        if predicted_marker
        else f'<rect x="{x + 90}" y="{y - 9}" width="10" height="10" fill="{PREDICTED}"/>'
    )
    return [
        f'<circle cx="{x + 5}" cy="{y - 4}" r="5" fill="{OBSERVED}"/>',
        _text(x + 14, y, "observed"),
        mark,
        _text(x + 105, y, "predicted"),
    ]


def means_svg(rows: list[MetricRow], key: str, ape_key: str, unit_label: str) -> Markup:
    """Observed vs predicted mean per experiment as a dot pair on a shared log axis, with the APE."""
    label = f"predicted vs observed {unit_label} per experiment"
    rows = [r for r in rows if finite(r.observed.get(key)) and finite(r.predicted.get(key))]
    if not rows:
        return _empty(label, "no test-split evaluation")
    names = [r.name for r in rows]
    row_h = 24
    box, H = _row_layout(names, row_h)
    xs = Scale.fit([m.get(key) for r in rows for m in (r.observed, r.predicted)], box.left, box.right, log=True)
    body = _row_axes(box, xs, f"{unit_label} (log scale)", names, row_h)
    for i, r in enumerate(rows):
        y = box.top + i * row_h + row_h / 2
        o, p, name = r.observed.get(key), r.predicted.get(key), r.name
        ape = getattr(r.ape, ape_key)
        body.append(
            f"<g>{_title(f'{name}: observed {fmt(o, 4)}, predicted {fmt(p, 4)}, APE {fmt(ape)}%')}"
            f'<line x1="{xs(o)}" y1="{y}" x2="{xs(p)}" y2="{y}" stroke="#bbb" stroke-width="3"/>'
            f'<circle cx="{xs(o)}" cy="{y}" r="5" fill="{OBSERVED}"/>{_diamond(xs(p), y, PREDICTED)}</g>'
        )
        body.append(_text(box.right + 10, y + 4, "APE n/a" if not finite(ape) else f"APE {ape:.1f}%"))
    body += _observed_predicted_legend(box.left, H - 8, predicted_marker=True)
    return _svg(760, H, label, body)


def distribution_svg(rows: list[MetricRow]) -> Markup:
    """E2E p50-p99 per experiment relative to the observed p50 (log axis), observed above predicted.

    Experiments differ in latency by orders of magnitude, so on one absolute axis each spread
    would shrink to a few pixels; dividing by the observed median puts every experiment's
    shape, and the predicted shift, on the same footing. Absolute values are in the tooltips.
    """
    label = "E2E distribution, predicted vs observed"
    rows = [r for r in rows if _percentiles(r)]
    if not rows:
        return _empty(label, "no stored E2E percentiles on the test split")
    names = [r.name for r in rows]
    row_h = 30
    box, H = _row_layout(names, row_h)
    ratios = [
        v / _percentiles(r)["observed"]["p50"] for r in rows for side in _percentiles(r).values() for v in side.values()
    ]
    xs = Scale.fit(ratios + [1.0], box.left, box.right, log=True)
    body = _row_axes(box, xs, "E2E latency / observed p50 (log scale): dot p50, tick p90, bar to p99", names, row_h)
    body.append(
        f'<line x1="{xs(1.0)}" y1="{box.top}" x2="{xs(1.0)}" y2="{box.bottom}" stroke="#999" stroke-dasharray="3 3"/>'
    )
    for i, r in enumerate(rows):
        pct = _percentiles(r)
        base = pct["observed"]["p50"]
        for offset, side, color in ((-6, "observed", OBSERVED), (6, "predicted", PREDICTED)):
            q = {k: v / base for k, v in pct[side].items()}
            y = box.top + i * row_h + row_h / 2 + offset
            tip = _title(
                f"{r.name} {side}: p50 {fmt(pct[side]['p50'], 4)} s, p90 {fmt(pct[side]['p90'], 4)} s, "
                f"p99 {fmt(pct[side]['p99'], 4)} s"
            )
            body.append(
                f'<g>{tip}<line x1="{xs(q["p50"])}" y1="{y}" x2="{xs(q["p99"])}" y2="{y}" stroke="{color}" '
                f'stroke-width="4" stroke-opacity="0.55"/><line x1="{xs(q["p90"])}" y1="{y - 5}" x2="{xs(q["p90"])}" '
                f'y2="{y + 5}" stroke="{color}" stroke-width="2"/><circle cx="{xs(q["p50"])}" cy="{y}" r="3.5" fill="{color}"/></g>'
            )
        body.append(_text(box.right + 10, box.top + i * row_h + row_h / 2 + 4, f"p50 {fmt(base)} s"))
    body += _observed_predicted_legend(box.left, H - 8, predicted_marker=False)
    return _svg(760, H, label, body)


def _percentiles(row: MetricRow) -> dict | None:
    pct = row.e2e_percentiles_s or {}
    ok = all(
        finite((pct.get(s) or {}).get(q)) and pct[s][q] > 0
        for s in ("observed", "predicted")
        for q in ("p50", "p90", "p99")
    )
    return pct if ok else None


# ---- context and rendering ----


def run_summary(archive: Archive, run: RunRecord, programs) -> dict:
    rid = run.id
    generations = archive.generations(rid)
    calls = archive.llm_calls(rid)
    front_ids = {p.id for p in pareto_front(programs)}
    operators: dict[str, dict] = {}
    for p in programs:
        kind = "seed" if p.operator == "seed" else p.operator
        o = operators.setdefault(kind, {"programs": 0, "full": 0, "front": 0})
        o["programs"] += 1
        o["full"] += p.full
        o["front"] += p.id in front_ids
    return {
        "data_label": run.data_label,
        "synthetic": run.synthetic,
        "seed": run.seed,
        "run_id": rid,
        "generations_completed": archive.last_generation(rid),
        "seconds": sum(g.seconds for g in generations),
        "evaluations": sum(g.evaluations for g in generations),
        "n_programs": len(programs),
        "n_full": sum(p.full for p in programs),
        "n_front": len(front_ids),
        # what the run's end fitted for comparison (--baselines), as its summary stored them
        "baselines": (run.summary or {}).get("baselines") or [],
        "operators": dict(sorted(operators.items(), key=lambda kv: -kv[1]["programs"])),
        "rejections": dict(Counter(r.rule for r in archive.rejections(rid)).most_common()),
        "llm": {
            "calls": len(calls),
            "cached": sum(c.cached for c in calls),
            "outcomes": dict(Counter(c.outcome for c in calls).most_common()),
            "models": dict(Counter(c.model for c in calls).most_common()),
            "prompt_tokens": sum(c.prompt_tokens for c in calls),
            "completion_tokens": sum(c.completion_tokens for c in calls),
            "cost_usd": sum(c.cost_usd for c in calls),
        },
    }


def explanation_svg(associations: list[dict], top: int = 4) -> Markup:
    """Where a program's error grows: its strongest associations, each a row of bars (the mean
    signed error % of the requests in each quartile of the feature, or each level), negative (the
    program too fast) to the left of the zero line."""
    label = "mean signed error of the requests in each quartile (level), %"
    shown = [a for a in associations[:top] if a.get("bins")]
    if not shown:
        return _empty(label, "no residuals stored")
    errors = [b["error_pct"] for a in shown for b in a["bins"] if finite(b["error_pct"])] or [0.0]
    reach = max(1.0, max(abs(e) for e in errors))
    names = []
    for a in shown:
        strength = f"rho {a['strength']:+.2f}" if a["kind"] == "rank" else f"eta2 {a['strength']:.2f}"
        names.append(f"{a['latency']} by {a['feature']} ({strength})")
    bar_h, gap = 16, 10
    heights = [len(a["bins"]) * bar_h + gap + 14 for a in shown]
    box = Box(260, 20, 700, 20 + sum(heights))
    xs = Scale(-reach, reach, box.left, box.right)
    body = [f'<line x1="{xs(0)}" y1="{box.top}" x2="{xs(0)}" y2="{box.bottom}" stroke="#888"/>']
    y = box.top
    for a, name in zip(shown, names):
        body.append(_text(10, y + 11, name, extra='font-weight="bold"'))
        y += 14
        for b in a["bins"]:
            e = b["error_pct"] if finite(b["error_pct"]) else 0.0
            x0, x1 = sorted((xs(0), xs(e)))
            color = PREDICTED if e < 0 else VALIDATE
            tip = _title(f"{b['range']}: {e:+.1f} % ({b['requests']} requests)")
            body.append(
                f'<g>{tip}<rect x="{x0}" y="{y + 2}" width="{max(x1 - x0, 1)}" height="{bar_h - 4}" fill="{color}"/></g>'
            )
            body.append(_text(box.left - 8, y + bar_h - 4, b["range"], anchor="end"))
            at = x1 + 4 if e >= 0 else xs(0) + 4  # a negative bar's figure right of the zero line, clear of the labels
            body.append(_text(at, y + bar_h - 4, f"{e:+.1f}"))
            y += bar_h
        y += gap
    body.append(_text(xs(0), box.bottom + 14, "0: too fast to the left, too slow to the right", anchor="middle"))
    return _svg(760, int(box.bottom + 24), label, body)


def explanations(archive: Archive, run_id: int, programs) -> list[dict]:
    """The run's stored explanations (the best and the deployed program's, at its end), with their plots."""

    by_id = {p.id: p for p in programs}
    top = best(programs)
    try:
        deployed = choose(archive, DEFAULT_RULE).program.id
    except UserError:  # nothing to deploy yet
        deployed = None
    out = []
    for e in archive.explanations(run_id):
        if e.program_id not in by_id:
            continue
        roles = [
            r
            for r, pid in (
                ("the best by validation loss", top.id if top else None),
                (f"deployed by {DEFAULT_RULE}", deployed),
            )
            if pid == e.program_id
        ]
        out.append(
            {
                "id": e.program_id,
                "roles": ", ".join(roles),
                "split": e.split,
                "requests": e.requests,
                "plot": explanation_svg(e.associations),
                "terms": e.screening.get("terms", [])[:5],
                "passed": e.screening.get("passed", 0),
                "candidates": e.screening.get("candidates", 0),
                "false_passes": e.screening.get("false_passes_by_chance", 0.0),
            }
        )
    return out


def build_context(archive: Archive) -> dict:
    run, programs = run_programs(archive)
    top = best(programs)
    test_rows = split_rows(archive, top.id).get("test", []) if top else []
    cv = cv_by_program(archive, run.id)
    rows = select_rows(programs, include_screened=True, sort="val", cv=cv)
    preferred, _, cv_settings, cv_left_out = ranked_cv(cv, {p.id for p in programs})
    return {
        "cv_protocols": protocol_order(proto for scores in cv.values() for proto in scores),
        "cv_preferred": preferred,
        "cv_settings": cv_settings,  # what the ranked scores share, as the deployment rules rank them
        "cv_left_out": cv_left_out,
        # cross-validated programs, lowest CV loss of the preferred protocol (of one setting) first
        "cv_rows": [r for r in select_rows(programs, include_screened=True, sort="cv", cv=cv) if r["cv"]],
        "archive_dir": str(archive.dir),
        "summary": run_summary(archive, run, programs),
        "best": top,
        "best_operator": operator_label(top) if top else None,
        "best_test_rows": test_rows,
        "plots": {
            "pareto": pareto_svg(programs),
            "history": history_svg(archive.generations(run.id)),
            "grid": grid_svg(programs),
            "means_e2e": means_svg(test_rows, "e2e_mean_s", "e2e", "mean E2E, s"),
            "means_ttft": means_svg(test_rows, "ttft_mean_s", "ttft", "mean TTFT, s"),
            "distribution": distribution_svg(test_rows),
        },
        "rows": rows,
        "programs": sorted(programs, key=lambda p: p.id),
        "explanations": explanations(archive, run.id, programs),
    }


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = fmt
    env.globals["operator_label"] = operator_label
    return env


def render(archive: Archive) -> str:
    template = (files(__package__) / "templates" / "report.html.j2").read_text(encoding="utf-8")
    return _environment().from_string(template).render(**build_context(archive))
