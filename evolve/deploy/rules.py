"""The deployment rules of `emit-go` and `blis-compare` (`choose`): which archived program a user
deploys (best, simplest, lineage, anchored, penalized, tethered, guarded; docs/results/physics.md
measured them held out), and why, as a `Choice`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepml_evolve.archive.access import BrowseError, run_programs
from stepml_evolve.archive.map_elites import scored
from stepml_evolve.archive.records import CVScoreRecord, ProgramRecord, seed_ancestor
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.numbers import finite
from stepml_evolve.evaluator.physics.tether import TETHER_FACTOR, TETHER_SHARE, envelope_steps, stray

from .choices import DEFAULT_JUDGE as DEFAULT_JUDGE  # re-exported with DEFAULT_RULE
from .choices import DEFAULT_RULE as DEFAULT_RULE  # re-exported: the default of the rules `choose` applies
from .choices import JUDGES, RULES
from .scores import cv_by_program, ranked_cv

MARGIN_RULES = ("simplest", "lineage", "anchored", "tethered", "guarded")  # the rules --within sets a margin of
DEFAULT_WITHIN = 5.0  # simplest: within this many percent of the best loss; lineage, anchored: a gain that counts
# guarded: a program must beat its own seed's loss by more than this many percent: the CV losses of
# programs that differ by a perturbed constant differ by up to ~15 % on the worlds (the fit's noise)
GUARD_MARGIN = 20.0
# tethered, guarded: a program's step times stay within TETHER_FACTOR of its seed's (as generation 0
# fitted it) on TETHER_SHARE of the steps of the floor's envelope (every catalog deployment, the
# steps users simulate)


@dataclass(frozen=True)
class Choice:
    """The program a deployment rule picked, and why."""

    program: ProgramRecord
    rule: str  # "best" or "simplest"
    protocol: str | None  # the CV protocol whose loss ranked the programs; None: validation loss
    loss: float  # the chosen program's loss of that kind
    best: ProgramRecord  # the lowest-loss program of that kind
    best_loss: float
    candidates: int  # programs that have a loss of that kind
    within: float | None = None  # simplest: percent over the best loss allowed; lineage, anchored: the gain that counts
    cv_settings: str = ""  # the fold fits' settings every ranked CV loss shares ("fit seed 7, max-evals 8")
    left_out: int = 0  # cross-validated programs left out: their scores have other settings
    judge: str = DEFAULT_JUDGE  # what ranked the cross-validated programs (JUDGES)
    also: tuple[str, ...] = ()  # guarded: the other protocols a child had to beat its seed under too

    @property
    def loss_name(self) -> str:
        if not self.protocol:
            return "validation loss"
        return f"{self.protocol} CV loss" if self.judge == "loss" else f"{self.protocol} held-out mean E2E error (%)"

    def describe(self) -> str:
        """One line: which rule, which loss, which program (for stderr and the Go file's header)."""
        pool = (
            f"{self.candidates} programs cross-validated with {self.cv_settings}"
            + (f"; {self.left_out} scored with other settings left out" if self.left_out else "")
            if self.protocol
            else f"{self.candidates} fully evaluated programs, none cross-validated"
        )
        if self.rule == "best":
            return f"best: #{self.program.id}, the lowest {self.loss_name} ({self.loss:.4f}) of {pool}"
        if self.rule == "tethered":
            return (
                f"tethered: #{self.program.id}, the lowest {self.loss_name} among programs within "
                f"{1 + self.within / 100:g}x of their seed's step times on {TETHER_SHARE:.0%} of the steps users simulate "
                f"(the floor's envelope; the best, #{self.best.id}: {self.best_loss:.4f}; of {pool})"
            )
        if self.rule == "guarded":
            also = f" (and under {', '.join(self.also)} where scored)" if self.also else ""
            return (
                f"guarded: #{self.program.id}, the lowest {self.loss_name} among the seed programs and the programs that "
                f"beat their own seed's by more than {self.within:g}%{also} and stay within {TETHER_FACTOR:g}x of that "
                f"seed's step times on {TETHER_SHARE:.0%} of the steps users simulate (the best, #{self.best.id}: "
                f"{self.best_loss:.4f}; of {pool})"
            )
        if self.rule == "penalized":
            return (
                f"penalized: #{self.program.id}, the lowest {self.loss_name} plus its constants' distance from "
                f"their priors (z^2 each; the best, #{self.best.id}: {self.best_loss:.4f}; of {pool})"
            )
        if self.rule in ("lineage", "anchored"):
            how = (
                "the best's nearest ancestor whose every step gained more than"
                if self.rule == "lineage"
                else "the best unless it beats the best seed's validation loss by at most"
            )
            return (
                f"{self.rule}: #{self.program.id}, {how} {self.within:g}% (the best, #{self.best.id}: "
                f"{self.loss_name} {self.best_loss:.4f}; of {pool})"
            )
        limit = self.best_loss * (1 + self.within / 100)
        return (
            f"simplest within {self.within:g}% of the best {self.loss_name} (#{self.best.id}, {self.best_loss:.4f}; "
            f"limit {_figure(limit)}): #{self.program.id}, complexity {self.program.complexity}, "
            f"{self.loss_name} {self.loss:.4f} (of {pool})"
        )


def _figure(x: float) -> str:
    """A loss as the lines show it (4 decimals), or a number too large for that in 4 significant
    digits (a limit of --within 1e308 is not printed as 300 digits)."""
    return f"{x:.4f}" if abs(x) < 1e9 else f"{x:.4g}"


def choose(
    archive: Archive,
    rule: str = "best",
    within: float | None = None,
    protocol: str | None = None,
    judge: str = DEFAULT_JUDGE,
    others: bool = True,
) -> Choice:
    """The latest run's program by a deployment rule. The loss is the CV loss of `protocol` (default:
    the preferred one: the protocol most programs have scores of, ties lomo, lowo, another) when any program of the run has a finite one
    (judge "e2e": the held-out mean E2E error of those scores instead), else the validation loss.
    best: the lowest loss (ties: the older program, as `show best`). simplest: the lowest complexity
    whose loss is at most best * (1 + within/100) (ties: lower loss, then older). lineage,
    anchored, penalized, tethered, guarded: see their helpers (tethered: `within` percent over 1 is its
    factor, default TETHER_FACTOR; guarded: `within` is its margin, default GUARD_MARGIN, and it asks
    every other protocol scored too unless `others` is False)."""
    if rule not in RULES:
        raise BrowseError(f"the rule must be one of {', '.join(RULES)}, not {rule!r}")
    if judge not in JUDGES:
        raise BrowseError(f"the judge must be one of {', '.join(JUDGES)}, not {judge!r}")
    within_given = within
    within = DEFAULT_WITHIN if within is None else within
    if not (within >= 0 and math.isfinite(within)):
        raise BrowseError(f"--within must be a percentage >= 0, not {within:g}")
    run, programs = run_programs(archive)
    cv = cv_by_program(archive, run.id)
    protocol, scores, settings, left_out = ranked_cv(cv, {p.id for p in programs}, protocol)
    values = _judged(scores, judge)
    cands = [(p, values[p.id]) for p in programs if p.id in values]
    if not cands:  # no CV score, or none with the judge's figure
        cands = [(p, p.val_loss) for p in scored(programs)]
        protocol, settings, left_out = None, "", 0
    if not cands:
        raise BrowseError(f"{archive.dir}: no program has been fully evaluated yet")
    best, best_loss = min(cands, key=lambda c: (c[1], c[0].id))
    chosen, loss = best, best_loss
    also: tuple[str, ...] = ()  # guarded: the other protocols it asked
    if rule == "simplest":
        limit = best_loss * (1 + within / 100)
        chosen, loss = min((c for c in cands if c[1] <= limit), key=lambda c: (c[0].complexity, c[1], c[0].id))
    elif rule in ("lineage", "anchored"):
        pick = _lineage(best, programs, within) if rule == "lineage" else _anchored(best, programs, within)
        chosen, loss = pick, dict((p.id, v) for p, v in cands).get(pick.id, math.nan)
    elif rule == "penalized":
        chosen, loss = min(cands, key=lambda c: (c[1] + _prior_distance(c[0]), c[0].id))
    elif rule == "guarded":
        within = GUARD_MARGIN if within_given is None else within
        asked = _other_protocols(cv, programs, protocol, judge) if others else {}
        chosen, loss = _guarded(cands, programs, within, asked)
        also = tuple(asked)
    elif rule == "tethered":
        factor = TETHER_FACTOR if within_given is None else 1 + within_given / 100
        chosen, loss = _tethered(cands, programs, factor)
        within = (factor - 1) * 100
    within = within if rule != "best" else None
    return Choice(chosen, rule, protocol, loss, best, best_loss, len(cands), within, settings, left_out, judge, also)


def _other_protocols(
    cv, programs: list[ProgramRecord], protocol: str | None, judge: str
) -> dict[str, dict[int, float]]:
    """The run's scores of every CV protocol but the ranking one, as `judge` reads them (finite
    values of one setting each, as `ranked_cv` keeps them; a score whose loss is not finite, a CV
    that failed, as inf): the other questions a user, or the run's end (--guard-cv), asked."""
    if protocol is None:
        return {}
    ids = {p.id for p in programs}
    have = {proto for scores in cv.values() for proto in scores} - {protocol}
    judged = {}
    for proto in sorted(have):
        failed = {pid: math.inf for pid in ids if (s := cv.get(pid, {}).get(proto)) and not finite(s.loss)}
        judged[proto] = {**failed, **_judged(ranked_cv(cv, ids, proto)[1], judge)}
    return {proto: values for proto, values in judged.items() if values}


def _judged(scores: dict[int, CVScoreRecord], judge: str) -> dict[int, float]:
    """The scores' figures `judge` ranks by (the CV loss, or the held-out mean E2E error), by program
    id; a score without a finite one is left out."""
    values = {pid: s.loss if judge == "loss" else s.e2e_mean for pid, s in scores.items()}
    return {pid: float(v) for pid, v in values.items() if finite(v)}


def own_seed(program: ProgramRecord, by_id: dict[int, ProgramRecord]) -> ProgramRecord:
    """The seed a program descends from: its first parents followed back (itself for a seed; the
    oldest ancestor the archive holds when the chain leaves it)."""
    return seed_ancestor(program, by_id.get)


def _guarded(cands: list, programs: list[ProgramRecord], within: float, others: dict[str, dict[int, float]]):
    """The lowest loss among the seeds and the programs that beat their own seed's loss by more than
    `within` percent (a program whose seed has no loss of that kind cannot show it does; the run's
    front CV scores the front's seeds too), do the same under every other protocol both they and
    their seed are scored under (`others`: protocol -> program id -> loss; a user who asked a
    second question, `evolve archive cv --protocol lowo`, gets a child that answers both) and are
    tethered to their seed (`tether` at most TETHER_FACTOR): a child must earn its difference from
    the physics it started from where the data can judge it, and keep to that physics where they
    cannot. If none qualifies, the best seed by validation loss."""
    by_id = {p.id: p for p in programs}
    loss_of = {p.id: v for p, v in cands}
    tethers = _Tethers(programs)

    def beats(losses: dict[int, float], program: ProgramRecord, seed: ProgramRecord) -> bool:
        return losses[program.id] < losses.get(seed.id, -math.inf) * (1 - within / 100)

    def qualifies(program: ProgramRecord, loss: float) -> bool:
        seed = own_seed(program, by_id)
        if seed.id == program.id:
            return True
        return (
            beats(loss_of, program, seed)
            and all(
                beats(losses, program, seed) for losses in others.values() if {program.id, seed.id} <= losses.keys()
            )
            and tethers(program) <= TETHER_FACTOR
        )

    return _lowest_qualifying(cands, programs, qualifies)


def _lowest_qualifying(cands: list, programs: list[ProgramRecord], qualifies):
    """The lowest-loss candidate (ties: the older) that `qualifies(program, loss)`; if none does, the
    best fully evaluated seed by validation loss, with its loss of the candidates' kind if it has one."""
    for program, loss in sorted(cands, key=lambda c: (c[1], c[0].id)):
        if qualifies(program, loss):
            return program, loss
    seed = best_seed(programs)
    return seed, {p.id: v for p, v in cands}.get(seed.id, seed.val_loss)


class _Tethers:
    """How far programs' step times stray from their seeds' over the floor's envelope, each seed's
    step times computed once."""

    def __init__(self, programs: list[ProgramRecord]):
        from stepml_evolve.evaluator.physics.floor import envelope_for

        self.by_id = {p.id: p for p in programs}
        self.env = envelope_for()
        self.seed_steps: dict[int, np.ndarray] = {}

    def _steps(self, program: ProgramRecord) -> np.ndarray:
        from stepml_evolve.evaluator.dsl import parse_program

        parsed = parse_program(program.source)
        return envelope_steps(parsed, parsed.constants, self.env)

    def __call__(self, program: ProgramRecord) -> float:
        root = own_seed(program, self.by_id)
        if root.id == program.id:
            return 1.0
        if root.id not in self.seed_steps:
            self.seed_steps[root.id] = self._steps(root)
        return stray(self._steps(program), self.seed_steps[root.id])


def tethered_children(programs: list[ProgramRecord], operator: str) -> list[ProgramRecord]:
    """The fully evaluated children of `operator` tethered to their seed (`tether` at most
    TETHER_FACTOR), by validation loss."""
    tethers = _Tethers(programs)
    children = [p for p in programs if p.operator == operator and _validation(p) < math.inf]
    return sorted((p for p in children if tethers(p) <= TETHER_FACTOR), key=lambda p: (_validation(p), p.id))


def tether(program: ProgramRecord, programs: list[ProgramRecord]) -> float:
    """How far a program's step times stray from its seed's (the seed its first parents lead back to,
    as generation 0 fitted it) over the floor's envelope: the TETHER_SHARE quantile of the factor
    between them (1.0: the seed itself; inf: a step time that is not finite)."""
    return _Tethers(programs)(program)


def best_seed(programs: list[ProgramRecord]) -> ProgramRecord | None:
    """The fully evaluated seed with the lowest validation loss (ties: the older): what a user would
    deploy without a search."""
    seeds = [p for p in programs if p.operator == "seed" and _validation(p) < math.inf]
    return min(seeds, key=lambda p: (_validation(p), p.id)) if seeds else None


def _tethered(cands: list, programs: list[ProgramRecord], factor: float = TETHER_FACTOR):
    """The lowest loss among programs tethered to their seed (`tether` at most `factor`); if none is,
    the best fully evaluated seed by validation loss (a seed is its own tether)."""
    tethers = _Tethers(programs)
    return _lowest_qualifying(cands, programs, lambda program, _loss: tethers(program) <= factor)


def _prior_distance(p: ProgramRecord) -> float:
    """The priors' penalty of a program at its archived constants (loss points: z^2 a constant)."""
    from stepml_evolve.evaluator.dsl import parse_program
    from stepml_evolve.evaluator.dsl.program import prior_penalty

    program = parse_program(p.source)
    return float(prior_penalty(program, [list(program.constants.values())])[0])


def _validation(p: ProgramRecord) -> float:
    return p.val_loss if p.full and p.val_loss is not None and math.isfinite(p.val_loss) else math.inf


def _lineage(best: ProgramRecord, programs: list[ProgramRecord], within: float) -> ProgramRecord:
    """The best program's nearest ancestor (itself included) each of whose steps from its first parent
    gained more than `within` percent of validation loss: a child whose gain is within the fit's noise
    gives way to its parent, whose physics the data had already judged."""
    by_id = {p.id: p for p in programs}
    cur = best
    while cur.parents and (parent := by_id.get(cur.parents[0])) is not None and _validation(parent) < math.inf:
        if _validation(cur) < _validation(parent) * (1 - within / 100):
            break
        cur = parent
    return cur


def _anchored(best: ProgramRecord, programs: list[ProgramRecord], within: float) -> ProgramRecord:
    """The best program, unless its validation loss beats the best seed's by at most `within` percent:
    then the best seed (seeds carry physics the search can trade for the training data's quirks)."""
    seed = best_seed(programs)
    if seed is None or best.operator == "seed":
        return best
    return best if _validation(best) < _validation(seed) * (1 - within / 100) else seed
