"""Cross-validation: fit a program on some experiments, score it on experiments it never saw.

Protocols (the research protocol's, plus any grouping a user writes down):
  lomo          leave one model out: one fold per model, holding out all its experiments;
  lowo          leave one workload out: one fold per workload;
  groups:FILE   a YAML mapping fold name -> the experiment names that fold holds out.

Each fold fits one global constant set on the train split of the other experiments (the same fit
`evolve fit` makes) and scores its held-out experiments on all their requests (split "all"). The
CV loss is the fit's objective over the held-out rows of every fold, so it reads like a fitting
loss. Folds are independent fits, run concurrently on the pool; every fit is a pure
function of its seed, so the numbers do not depend on the worker count or on which fold ends first.
"""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.choices import GROUPS, GROUPS_PREFIX, PROTOCOLS
from stepml_evolve.evaluator.data.experiments import ALL, Experiment
from stepml_evolve.evaluator.dsl import Program
from stepml_evolve.evaluator.errors import UserError, shown
from stepml_evolve.evaluator.fit.fitting import FitConfig, FitResult, ProgressFn, fit_constants
from stepml_evolve.evaluator.fit.starts import fit_from_starts
from stepml_evolve.evaluator.readers import read_yaml
from stepml_evolve.evaluator.scoring.metrics import APE_KEYS, MetricRow
from stepml_evolve.evaluator.scoring.pool import ReplayPool

IN_DISTRIBUTION = "in-distribution"  # the comparison fit on every experiment


class FoldError(UserError, ValueError):
    """A protocol that cannot make folds from the data: one line naming the file and fold."""


@dataclass(frozen=True)
class Fold:
    name: str
    train: tuple[str, ...]  # experiment names the constants are fitted on
    held_out: tuple[str, ...]  # experiment names scored on all their requests


def make_folds(protocol: str, experiments: list[Experiment], groups: dict[str, list[str]] | None = None) -> list[Fold]:
    """The folds of `protocol` over `experiments` (each fold trains on every experiment it does not
    hold out); protocol GROUPS takes the folds from `groups` (fold name -> the names it holds out)."""
    if protocol == GROUPS:
        origin = "the run's groups"
        held = check_groups(groups or {}, [e.name for e in experiments], origin)
    elif protocol in PROTOCOLS:
        key = (lambda e: e.model) if protocol == "lomo" else (lambda e: e.workload)
        held: dict[str, list[str]] = {}
        for e in experiments:
            held.setdefault(key(e), []).append(e.name)
        origin = f"protocol {protocol}"
    elif protocol.startswith(GROUPS_PREFIX):
        path = Path(protocol[len(GROUPS_PREFIX) :])
        held = read_groups(path, [e.name for e in experiments])
        origin = str(path)
    else:
        raise FoldError(f"protocol must be {', '.join(PROTOCOLS)} or {GROUPS_PREFIX}FILE, not {protocol!r}")
    if protocol in PROTOCOLS and len(held) < 2:
        raise FoldError(
            f"{origin}: the data has one {'model' if protocol == 'lomo' else 'workload'} only, "
            "so there is nothing to hold out"
        )
    names = [e.name for e in experiments]
    folds = []
    for fold, out in sorted(held.items()):
        train = tuple(n for n in names if n not in out)
        if not train:
            raise FoldError(f"{origin}: fold {fold!r} holds out every experiment, leaving none to train on")
        folds.append(Fold(_fold_name(fold), train, tuple(sorted(out))))
    return folds


def _fold_name(key: str) -> str:
    return key.rsplit("/", 1)[-1]  # a model id's last part (meta-llama/Llama-2-7b-hf -> Llama-2-7b-hf)


def read_groups(path: Path, experiments: list[str]) -> dict[str, list[str]]:
    """A groups file's folds (fold name -> the experiment names it holds out), checked against
    the data's experiment names: a FoldError naming the file and the fold otherwise."""
    return check_groups(read_yaml(path, FoldError, "groups file"), experiments, str(path))


def check_groups(data, experiments: list[str], path: str) -> dict[str, list[str]]:
    """`data` (a groups file's content, or a run's stored groups) as folds of `experiments`."""
    if not isinstance(data, dict) or not data:
        raise FoldError(f"{path}: expected a mapping of fold name -> list of experiment names to hold out")
    known = set(experiments)
    out: dict[str, list[str]] = {}
    for fold, names in data.items():
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names:
            raise FoldError(f"{path}: fold {shown(fold)} holds out no experiment (give a list of experiment names)")
        for n in names:
            if not isinstance(n, str) or n not in known:
                raise FoldError(f"{path}: fold {shown(fold)} names {shown(n)}, which is not an experiment of the data")
        if len(set(names)) != len(names):
            raise FoldError(f"{path}: fold {shown(fold)} names an experiment twice")
        out[str(fold)] = names
    return out


@dataclass
class FoldResult:
    fold: Fold
    fit: FitResult
    rows: list[MetricRow]  # held-out experiments, split "all"
    # with several starts: every start's fit and its held-out rows, in order (`fit` is the one of
    # lowest train loss plus penalties, what the fold kept); one start: empty
    starts: list[tuple[FitResult, list[MetricRow]]] = dataclasses.field(default_factory=list)

    @property
    def constants(self) -> dict[str, float]:
        return self.fit.constants["all"]


@dataclass
class CrossValidation:
    protocol: str
    folds: list[FoldResult]
    loss: float  # the fit's objective over every fold's held-out rows
    in_distribution: FoldResult | None = None  # fitted on every experiment, all scored: the gap's other side
    warm_started: bool = False  # folds fitted from a fit on every experiment (cross_validate's `warm`)
    start_losses: list[float] = dataclasses.field(default_factory=list)  # the CV loss had every fold kept start k

    @property
    def rows(self) -> list[MetricRow]:
        return [r for f in self.folds for r in f.rows]

    def summary(self) -> dict[str, dict[str, float]]:
        return summarize(self.rows)


def summarize(rows: list[MetricRow]) -> dict[str, dict[str, float]]:
    """Mean, median and max APE over rows, per metric (infinite where a replay failed)."""
    out = {}
    for metric in APE_KEYS:
        v = np.array([_ape(r, metric) for r in rows], dtype=float)
        v = v[~np.isnan(v)]
        out[metric] = (
            {"mean": float(v.mean()), "median": float(np.median(v)), "max": float(v.max())}
            if len(v)
            else {"mean": math.nan, "median": math.nan, "max": math.nan}
        )
    return out


def _ape(row: MetricRow, metric: str) -> float:
    v = getattr(row.ape, metric)
    return math.nan if v is None else float(v)


def cross_validate(
    program: Program,
    experiments: list[Experiment],
    pool: ReplayPool,
    protocol: str,
    folds: list[Fold],
    config: FitConfig = FitConfig(),
    start: dict[str, float] | None = None,
    progress: ProgressFn | None = None,
    percentiles: bool = False,
    in_distribution: bool = False,
    warm: tuple[FitConfig, FitResult] | None = None,
    starts: int = 1,
) -> CrossValidation:
    """Fit each fold on its train experiments (global scope) and score its held-out ones on all requests.
    With `in_distribution`, also fit on every experiment and score them all the same way, for comparison.
    `starts` > 1 fits each fold from the program's constants and from draws from their priors
    (evaluator/fit/starts.py), keeps each fold's best train fit, and reports the CV loss each start
    alone would give (`start_losses`): how far a structure's held-out loss moves with its start.

    `warm` (the search's cheap folds): (a config, a global trust-region fit on every experiment);
    each fold is fitted with that config from the fit's constants and closed loop (no replay for
    its start), so a fold costs its few trust-region steps. Its start has seen the held-out
    experiments' train split, so the CV loss it gives can read lower than independent folds'
    (docs/HISTORY.md measures by how much); `evolve cv` never warm-starts."""
    by_name = {e.name: e for e in experiments}
    config = dataclasses.replace(config, scope="global", experiments=None)
    everything = tuple(e.name for e in experiments)
    inside_fold = Fold(IN_DISTRIBUTION, everything, everything)

    def one(fold: Fold, cfg: FitConfig = config, begin=start, known=None) -> FoldResult:
        train = [by_name[n] for n in fold.train]
        report = (lambda g, *a: progress(fold.name, *a)) if progress else None
        if starts > 1 and known is None:
            first = dict(program.constants) if begin is None else begin
            res, every = fit_from_starts(program, train, pool, cfg, first, starts, progress=report)
        else:
            res = fit_constants(program, train, pool, cfg, start=begin, progress=report, recorded_start=known)
            every = [res]
        held = [by_name[n] for n in fold.held_out]

        def scored(fit: FitResult) -> list[MetricRow]:
            vector = np.array([fit.constants["all"][k] for k in program.constants], dtype=float)
            return pool.score(program, [vector] * len(held), (ALL,), held, percentiles)[ALL]

        if len(every) == 1:
            return FoldResult(fold, res, scored(res))
        each = [(fit, scored(fit)) for fit in every]
        return FoldResult(fold, res, next(rows for fit, rows in each if fit is res), each)

    jobs = [(f,) for f in folds]
    if warm is not None:
        cfg, start_fit = warm
        cfg = dataclasses.replace(cfg, scope="global", experiments=None)
        jobs = [(f, cfg, start_fit.constants["all"], start_fit.recorded) for f in folds]
    jobs += [(inside_fold,)] if in_distribution else []
    with ThreadPoolExecutor(min(len(jobs), pool.workers)) as threads:
        results = list(threads.map(lambda job: one(*job), jobs))
    results, inside = (results[:-1], results[-1]) if in_distribution else (results, None)
    loss = config.objective.of_rows([r for f in results for r in f.rows])
    by_start = [
        config.objective.of_rows([r for f in results for r in f.starts[k][1]]) for k in range(len(results[0].starts))
    ]
    return CrossValidation(protocol, results, loss, inside, warm is not None, by_start)
