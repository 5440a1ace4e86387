"""The evaluation cascade: what a valid child's fits are, and what they make of it in the archive.

  1. screening: a quick fit (one experiment per model, short window, small budget, warm start
     from the child's own constants);
  2. promotion: the archive says which children would open a cell or improve on its elites
     (`Elites.status`); at most `max_promotions` of them, most promising first;
  3. the full fit on all experiments (with --cv the fold fits too, whose CV loss becomes the
     validation loss), then the replay on every split;
  4. the record the archive stores (`program_record`).
The search loop runs it on a generation's children at once, OpenEvolve's judge on one child at a
time (`Cascade.judge`). Every fit is seeded by the run's seed and where the child stands, so the
same child in the same place is judged the same way.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from stepml_evolve.archive.map_elites import Elites, best
from stepml_evolve.archive.records import CVEvaluationRecord, CVScoreRecord, NewProgram, ProgramRecord, RejectionRecord
from stepml_evolve.evaluator.data.experiments import SPLITS
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import Program, compile_program
from stepml_evolve.evaluator.fit.crossval import CrossValidation, cross_validate, make_folds
from stepml_evolve.evaluator.fit.fitting import (
    FAILED_LOSS,
    FAILED_REASON,
    FitConfig,
    FitResult,
    fit_constants,
    fit_experiments,
    quick_config,
)
from stepml_evolve.evaluator.fit.starts import fit_from_starts
from stepml_evolve.evaluator.scoring.metrics import MetricRow
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evaluator.seeding import mix

from .emitters import RESIDUAL_TERM as RESIDUAL_OPERATOR
from .emitters import Emitter, Proposal
from .settings import SearchConfig
from .structure import structure_hash

BASELINE_FIT = 3  # where a baseline's fit stands in the run's random streams (a child's fits use 1 and 2)


@dataclass(eq=False)
class Candidate:
    """A valid child in the cascade."""

    program: Program
    proposal: Proposal
    emitter: Emitter | None  # None: judged for an outside engine (`Cascade.judge`)
    island: int
    quick_loss: float = math.nan
    constants: dict[str, float] = dataclasses.field(default_factory=dict)

    def failed(self) -> RejectionRecord:
        """Its rejection when the quick fit found no finite, positive step times."""
        return RejectionRecord(
            operator=self.proposal.operator,
            parents=self.proposal.parents,
            rule="evaluation",
            reason=FAILED_REASON,
            source=self.program.source,
        )


@dataclass
class FullFit:
    constants: dict[str, float]
    train_loss: float
    val_loss: float
    test_loss: float
    screen_loss: float
    rows: list[MetricRow]  # every experiment on every split
    cv: CVScoreRecord | None = None  # with --cv: the fold fits' score (val_loss is its loss)
    cv_rows: list[CVEvaluationRecord] = dataclasses.field(default_factory=list)


@dataclass
class Judgement:
    """What `Cascade.judge` made of one child: an archivable program or a rejection, and the loss an
    outside engine ranks it by (its validation loss; estimated for a screened child; inf if rejected)."""

    program: NewProgram | None
    rejection: RejectionRecord | None
    loss: float

    @property
    def promoted(self) -> bool:
        """Fully evaluated (a promoted child, or an archived seed OpenEvolve starts from)."""
        return self.program is not None and self.program.record.full


def program_record(
    program: Program,
    constants: dict,
    proposal: Proposal,
    island: int,
    stage: str,
    quick_loss: float | None = None,
    full: FullFit | None = None,
) -> NewProgram:
    """A program as the archive stores it: its source with `constants`, lineage, descriptors, losses
    and (fully evaluated) its per-experiment rows."""
    fitted = program.with_constants(constants) if constants else program
    record = ProgramRecord(
        id=None,
        source_hash=structure_hash(program),
        source=fitted.source,
        constants=constants,
        parents=proposal.parents,
        operator=proposal.operator,
        operator_detail=proposal.detail,
        island=island,
        complexity=program.complexity,
        n_components=len(program.components_used),
        components=program.components_used,
        stage=stage,
        quick_loss=quick_loss,
    )
    if full is None:
        return NewProgram(record)
    record = dataclasses.replace(
        record,
        train_loss=full.train_loss,
        val_loss=full.val_loss,
        test_loss=full.test_loss,
        screen_loss=full.screen_loss,
    )
    return NewProgram(record, full.rows, full.cv, full.cv_rows)


class Cascade:
    """A run's cascade: its fit settings and data, and a count of the closed-loop evaluations spent."""

    def __init__(self, data: LoadedData, pool: ReplayPool, config: SearchConfig):
        self.exps, self.pool, self.cfg = data.experiments, pool, config
        self.goal = config.goal()
        # the data must allow them
        self.folds = make_folds(config.cv, self.exps, config.fold_groups()) if config.cv != "none" else None
        quick = quick_config(0, self.exps, config.fit_method)
        self.quick = dataclasses.replace(
            quick,
            objective=self.goal,
            max_evals=config.quick_evals or quick.max_evals,
            surrogate_evals=config.quick_surrogate,
            window=config.quick_window,
            linear_solve=config.linear == "solve",
            floor=config.physics == "check",
        )
        self.screen_exps = fit_experiments(self.exps, self.quick)
        self._evaluations = 0
        self._counting = threading.Lock()

    def take_evaluations(self) -> int:
        """Closed-loop evaluations since the last call."""
        with self._counting:
            n, self._evaluations = self._evaluations, 0
        return n

    def screen(self, cands: list[tuple[Candidate, tuple[int, ...]]]) -> None:
        """Quick-fit each candidate from its own constants (all at once), seeded by the run's seed
        and where it stands (generation and index, or its structure): its quick loss and constants."""

        def quick_fit(item: tuple[Candidate, tuple[int, ...]]) -> FitResult:
            cand, where = item
            res = fit_constants(
                cand.program,
                self.exps,
                self.pool,
                dataclasses.replace(self.quick, seed=self._seed(*where, 1)),
                start=cand.program.constants,
            )
            self._count(res.evaluations)
            return res

        for (cand, _), res in zip(cands, _at_once(quick_fit, cands)):
            cand.quick_loss, cand.constants = res.loss, res.constants["all"]

    def promotion_order(self, cands: list[Candidate], elites: Elites) -> list[Candidate]:
        """Children worth a full fit, most promising first: improvements on their cell's elite or
        on the front, an empty cell's child included (by quick loss vs screening loss), then
        children that only open an empty cell (`Elites.promotion_key`)."""
        best_screen = elites.best_screen_loss()
        keyed = []
        for c in cands:
            if not c.quick_loss < self.cfg.sanity_factor * best_screen:
                continue
            key = elites.promotion_key(
                c.program.complexity, len(c.program.components_used), c.quick_loss, self.cfg.promote_margin
            )
            if key is not None:
                keyed.append((key, c))
        return [c for _, c in sorted(keyed, key=lambda t: t[0])][: self.cfg.max_promotions]

    def full_fits(self, cands: list[tuple[Candidate, tuple[int, ...]]]) -> list[FullFit]:
        """Promoted candidates fully fitted from their screening constants and full_fit_starts - 1
        draws from their priors (a residual_term child: seed_starts - 1, as its seed was), the best
        kept (all at once), seeded by the run's seed and where each stands."""
        return _at_once(
            lambda item: self._full_fit(
                item[0].program,
                item[0].constants,
                self._seed(*item[1], 2),
                self.cfg.full_fit_evals,
                self.cfg.full_fit_sigma,
                starts=self._starts(item[0]),
            ),
            cands,
        )

    def _starts(self, cand: Candidate) -> int:
        """A residual_term child adds a structure its seed lacks, its constants starting where the
        screening's linearization put them (a tile's padding at half the law's on the tile world):
        judged by as many fits as its seed, so the structure, not one start, decides."""
        aimed = cand.proposal.operator == RESIDUAL_OPERATOR
        return max(self.cfg.full_fit_starts, self.cfg.seed_starts) if aimed else self.cfg.full_fit_starts

    def seed_fits(self, programs: list[Program]) -> list[FullFit]:
        """Generation 0: each seed program fully fitted with the standard first step from its own
        constants and from seed_starts - 1 draws from its priors, the best kept (all at once)."""
        return _at_once(
            lambda i: self._full_fit(
                programs[i],
                programs[i].constants,
                self._seed(0, i),
                self.cfg.seed_fit_evals,
                FitConfig.sigma0,
                promoted=False,
                starts=self.cfg.seed_starts,
            ),
            range(len(programs)),
        )

    def baseline_fits(self, programs: list[Program]) -> list[FullFit]:
        """Baselines (BLIS's blackbox regression) fitted and scored as a seed is in generation 0,
        but from one start and without the floor, which a regression does not keep: compared with
        the programs, never one of them."""
        with self.pool.floor_off():
            return _at_once(
                lambda i: self._full_fit(
                    programs[i],
                    programs[i].constants,
                    self._seed(0, BASELINE_FIT, i),
                    self.cfg.seed_fit_evals,
                    FitConfig.sigma0,
                    promoted=False,
                    floor=False,
                ),
                range(len(programs)),
            )

    def judge(
        self, child: Program, proposal: Proposal, programs: list[ProgramRecord], island: int | None = None
    ) -> Judgement:
        """One valid child through the cascade on its own, for an engine that hands children over
        one at a time: quick fit, promotion against the elites of `programs` (those of `island`;
        None: of every island, and the record says island 0), full fit. Its fits are seeded by the
        run's seed and the child's structure."""
        where = (int(structure_hash(child), 16),)
        cand = Candidate(child, proposal, None, island or 0)
        self.screen([(cand, where)])
        if not cand.quick_loss < FAILED_LOSS:
            return Judgement(None, cand.failed(), math.inf)
        elites = Elites.of([p for p in programs if island is None or p.island == island])
        if self.promotion_order([cand], elites):
            (full,) = self.full_fits([(cand, where)])
            return Judgement(
                program_record(child, full.constants, proposal, cand.island, "full", cand.quick_loss, full),
                None,
                full.val_loss,
            )
        # not promoted: its validation loss is estimated from its quick loss, scaled as the best
        # program's validation loss is to its screening loss (both on the screening windows)
        top = best(programs)
        scale = top.val_loss / top.screen_loss if top and top.screen_loss and top.val_loss is not None else 1.0
        return Judgement(
            program_record(child, cand.constants, proposal, cand.island, "screened", cand.quick_loss),
            None,
            cand.quick_loss * scale,
        )

    def _seed(self, *where: int) -> int:
        """A fit's seed (FitConfig's range) from the run's seed and where the fit stands."""
        return mix(self.cfg.seed, *where) % (2**31)

    def _count(self, evaluations: int) -> None:
        with self._counting:
            self._evaluations += evaluations

    def full_fit_config(
        self, seed: int, max_evals: int | None, sigma: float, promoted: bool = True, floor: bool = True
    ) -> FitConfig:
        config = FitConfig(
            seed=seed,
            max_evals=max_evals,
            sigma0=sigma,
            method=self.cfg.fit_method,
            objective=self.goal,
            floor=floor and self.cfg.physics == "check",
        )
        if not promoted:  # a seed's fit in generation 0: the standard trust region
            return config
        return dataclasses.replace(
            config,
            candidates=self.cfg.full_fit_candidates,
            surrogate_evals=self.cfg.full_fit_surrogate,
            linear_solve=self.cfg.linear == "solve",
        )

    def _full_fit(
        self,
        program: Program,
        start: dict[str, float],
        seed: int,
        max_evals: int | None,
        sigma: float,
        promoted: bool = True,
        starts: int = 1,
        floor: bool = True,
    ) -> FullFit:
        """The fit on every experiment (the best of `starts`: evaluator/fit/starts.py), scored on
        every split; with --cv also the fold fits (by default warm-started from it, see
        SearchConfig.cv_fit_evals), whose CV loss becomes the validation loss."""
        config = self.full_fit_config(seed, max_evals, sigma, promoted, floor)
        cv: CrossValidation | None = None
        fold_config = config  # the folds' fit settings, as the CV score stores them

        def best_fit() -> FitResult:
            best, every = fit_from_starts(program, self.exps, self.pool, config, start, starts)
            self._count(sum(r.evaluations for r in every) - best.evaluations)  # the best one is counted below
            return best

        if self.folds and self.cfg.cv_fit_evals:  # the fit on every experiment, then folds warm-started from it
            res = best_fit()
            t0 = time.perf_counter()
            fold_config = dataclasses.replace(config, max_evals=self.cfg.cv_fit_evals)
            cv = cross_validate(program, self.exps, self.pool, self.cfg.cv, self.folds, config, warm=(fold_config, res))
            self._count(sum(f.fit.evaluations for f in cv.folds))
            cv_seconds = time.perf_counter() - t0
        elif self.folds:  # independent folds, as `evolve cv` fits them (runs stored before --cv-fit-evals)
            t0 = time.perf_counter()
            cv = cross_validate(
                program, self.exps, self.pool, self.cfg.cv, self.folds, config, start=start, in_distribution=True
            )
            res = cv.in_distribution.fit  # the same fit as without --cv (same seed, same constants)
            self._count(sum(f.fit.evaluations for f in cv.folds))
            cv_seconds = time.perf_counter() - t0
        else:
            res = best_fit()
        self._count(res.evaluations)
        consts = res.constants["all"]
        vec = np.array([consts[k] for k in program.constants], dtype=float)
        rows = self.pool.score(program, [vec] * len(self.exps), SPLITS, percentiles=True)
        screen = self.pool.population_losses(compile_program(program), [vec], self.screen_exps, objective=self.goal)[0]
        self._count(2)
        of = self.goal.of_rows
        full = FullFit(
            consts,
            of(rows["train"]),
            of(rows["validate"]),
            of(rows["test"]),
            screen,
            [r for s in SPLITS for r in rows[s]],
        )
        if cv is None:
            return full
        score = CVScoreRecord.of(0, cv, fold_config, self.cfg.semantics, cv_seconds)
        held = [CVEvaluationRecord.of(0, cv.protocol, f.fold.name, r) for f in cv.folds for r in f.rows]
        return dataclasses.replace(full, val_loss=cv.loss, cv=score, cv_rows=held)


def _at_once(fit_one: Callable, items) -> list:
    """fit_one over items concurrently, results in item order. Each fit hands its replays to the
    pool, so the executor sees every fit's batches at once (a cluster's workers are busy with
    all children, not one). A fit is a pure function of its program, start, seed and data, so
    the archive is the one sequential fits give."""
    items = list(items)
    if len(items) <= 1:
        return [fit_one(x) for x in items]
    with ThreadPoolExecutor(len(items), thread_name_prefix="fit") as threads:
        return list(threads.map(fit_one, items))
