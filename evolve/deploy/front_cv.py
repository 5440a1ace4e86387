"""The Pareto front of a run cross-validated, the step between a search and the deployment rules:
the run's fit settings for the fold fits (`run_fit_settings`), archived programs cross-validated
and their scores stored one by one (`cross_validate_programs`, behind `evolve archive cv` too),
what a run does at its end (`score_front`: the front and the seeds under --front-cv, then
guarded's pick and its seed under --guard-cv, until a pick answers both) and what emit-go would
deploy from it (`deployed_summary`).

Each program is cross-validated exactly as `evolve cv` would cross-validate its file
(`evolve archive show ID --source`): the folds of the protocol over the run's experiments, each
fold's constants fitted (the run's fit method, objective, weights and replay semantics; the
program's fitted constants as the start) on the train split of the other experiments, the held-out
experiments scored on all their requests. A program already scored under the protocol with the
same settings (seed, max-evals, method, objective, semantics) is skipped unless `again`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from stepml_evolve.archive.access import BrowseError
from stepml_evolve.archive.map_elites import pareto_front
from stepml_evolve.archive.records import CVScoreRecord, ProgramRecord, RunRecord, refit_of
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.choices import DEFAULT_SEMANTICS
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import parse_program
from stepml_evolve.evaluator.fit.crossval import FoldError, cross_validate, make_folds
from stepml_evolve.evaluator.fit.fitting import FitConfig, ProgressFn
from stepml_evolve.evaluator.say import SKIPPED, Say, quiet
from stepml_evolve.evaluator.scoring.objectives import Objective
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.search import RunSettings, SearchConfig

from .choices import DEFAULT_RULE
from .pins import pins_of, pins_text
from .rules import choose, own_seed, tethered_children


@dataclass(frozen=True)
class RunFitSettings:
    """How the run fitted its programs, for the fold fits: method and objective (in `config`, with
    the seed and budget of the cross-validation) and the replay's semantics."""

    config: FitConfig
    semantics: str

    def settings(self, protocol: str) -> dict:
        """As a stored score records them (`CVScoreRecord.settings`): what makes a score redoable or not."""
        return _blank_score(protocol, self).settings()


def run_fit_settings(
    run: RunRecord, seed: int = FitConfig.seed, max_evals: int | None = FitConfig.max_evals
) -> RunFitSettings:
    """The run's fit method, objective (with its weights) and semantics, as stored with its settings
    (a run stored before a setting existed ran with its legacy value, as `--resume` assumes)."""
    search = RunSettings.stored(run.config).search
    weights = tuple((str(p), float(w)) for p, w in (search.get("weights") or ()))
    goal = Objective(search.get("objective") or "rms", weights)
    floor = search.get("physics") == "check"  # a run's fits kept its programs at or above the floor, or not
    config = dataclasses.replace(
        FitConfig(seed=seed, max_evals=max_evals, method=search["fit_method"], floor=floor), objective=goal
    )
    return RunFitSettings(config, search.get("semantics") or DEFAULT_SEMANTICS)


def _blank_score(protocol: str, fit: RunFitSettings) -> CVScoreRecord:
    c = fit.config
    return CVScoreRecord(
        program_id=0,
        protocol=protocol,
        seed=c.seed,
        max_evals=c.max_evals,
        method=c.method,
        objective=c.objective.name,
        weights=[list(w) for w in c.objective.weights],
        semantics=fit.semantics,
    )


@dataclass
class ProgramCV:
    program: ProgramRecord
    score: CVScoreRecord
    skipped: bool  # already scored with the same settings; `score` is the stored one

    def to_json(self) -> dict:
        p = self.program
        return {
            "id": p.id,
            "complexity": p.complexity,
            "val_loss": p.val_loss,
            "skipped": self.skipped,
            "cv": self.score.to_json(),
        }


def cross_validate_programs(
    archive: Archive,
    programs: list[ProgramRecord],
    loaded: LoadedData,
    pool: ReplayPool,
    protocol: str,
    fit: RunFitSettings,
    *,
    again: bool = False,
    progress: ProgressFn | None = None,
    say: Say = quiet,
) -> list[ProgramCV]:
    """Cross-validate each program (in order) and store its score as soon as it is done (a killed
    job keeps the finished ones). The folds are made first, so a protocol the data cannot serve
    fails before any fit. `pool` replays `loaded.experiments` with `fit.semantics`."""
    folds = make_folds(protocol, loaded.experiments)
    if pool.semantics != fit.semantics:
        raise ValueError(f"the pool replays with {pool.semantics} semantics, the run with {fit.semantics}")
    wanted = fit.settings(protocol)
    stored = {
        s.program_id: s for pid in {p.id for p in programs} for s in archive.cv_scores(pid) if s.protocol == protocol
    }
    out: list[ProgramCV] = []
    for i, p in enumerate(programs):
        old = stored.get(p.id)
        if old is not None and not again and old.settings() == wanted:
            say(f"#{p.id}: already scored under {protocol} with these settings; skipped (--again redoes it)")
            out.append(ProgramCV(p, old, True))
            continue
        say(f"#{p.id} ({i + 1} of {len(programs)}): {protocol}, {len(folds)} folds")
        t0 = time.perf_counter()
        cv = cross_validate(
            parse_program(p.source),
            loaded.experiments,
            pool,
            protocol,
            folds,
            fit.config,
            start=dict(p.constants) or None,
            progress=progress,
            percentiles=True,
        )
        out.append(ProgramCV(p, archive.write_cv(p.id, cv, fit.config, fit.semantics, time.perf_counter() - t0), False))
    return out


# the run's end also cross-validates this many `residual_term` children: each adds a term that lowered
# its parent's residuals held out by model and by workload (the screening's own test), which the
# trained experiments' validation loss may not reward: on the real data the regime_switch seed plus
# a collective latency per layer, validation 37.2 against the seed's 31.2, holds out 26 % better
# leaving one model out and 70 % better leaving one workload out
MECHANISMS = 4


def deployed_summary(archive: Archive) -> dict:
    """What `evolve emit-go` would deploy from this run by default (DEFAULT_RULE), and why."""
    try:
        choice = choose(archive, DEFAULT_RULE)
    except BrowseError:
        return {}
    refit = refit_of(archive.programs(choice.program.run_id)).get(choice.program.id)
    deployed = {"rule": DEFAULT_RULE, "id": choice.program.id, "refit_of": refit, "why": choice.describe()}
    if pins := pins_of(archive, choice.program):
        deployed["pinned"] = {"seed": pins["seed"], "constants": pins["pinned"], "why": pins_text(pins)}
    return {"deployed": deployed}


def score_front(
    archive: Archive,
    run_id: int,
    loaded: LoadedData,
    pool: ReplayPool,
    config: SearchConfig,
    summary: dict,
    say: Say = quiet,
) -> dict:
    """Cross-validate the front members and the fully evaluated seeds that have no score of `config.front_cv` yet (a resumed run
    finishes what a killed one started), store the scores, and add them to the run's summary; then
    ask guarded's pick --guard-cv's question (`guard_question`; the programs asked, if any, are the
    summary's `guard_cv`). Each fold fit gets the budget of a promoted child's fit (--full-fit-evals)."""
    protocol, guard = config.front_cv, config.guard_cv
    if not _folds_made(protocol, loaded, "cross-validating the front", say):
        return summary
    fit = run_fit_settings(archive.run(run_id), seed=config.seed, max_evals=config.full_fit_evals)
    scored = cross_validate_front(archive, run_id, loaded, pool, protocol, fit, say)
    summary = {**summary, "front": [{**f, "cv": {protocol: scored.get(f["id"])}} for f in summary.get("front", [])]}
    if guard not in ("none", protocol) and _folds_made(guard, loaded, "asking guarded's pick a second question", say):
        t0 = time.perf_counter()
        if asked := guard_question(archive, run_id, loaded, pool, guard, fit, say):
            summary["guard_cv"] = {"protocol": guard, "asked": asked, "seconds": time.perf_counter() - t0}
    archive.set_summary(run_id, summary)
    return summary


def _folds_made(protocol: str, loaded: LoadedData, what: str, say: Say) -> bool:
    """Whether the data can make the protocol's folds; if not (one model, one workload), `what` is
    said to be skipped."""
    try:
        make_folds(protocol, loaded.experiments)
    except FoldError as e:
        say(f"{SKIPPED}{what}: {e}")
        return False
    return True


def cross_validate_front(
    archive: Archive,
    run_id: int,
    loaded: LoadedData,
    pool: ReplayPool,
    protocol: str,
    fit: RunFitSettings,
    say: Say = quiet,
) -> dict[int, float | None]:
    """Cross-validate under `protocol` the run's front members and fully evaluated seeds that have no
    score of it yet; every stored loss of the protocol by program id."""

    def losses() -> dict[int, float | None]:
        return {s.program_id: s.loss for s in archive.cv_scores(run_id=run_id) if s.protocol == protocol}

    programs = archive.programs(run_id)
    # every fully evaluated seed too: the guarded rule compares a program with the seed it descends
    # from, and falls back to the seeds, under the same CV
    seeds = [p for p in programs if p.operator == "seed" and p.full]
    # and the mechanisms the screening found held out, which validation on the trained experiments
    # may not see (MECHANISMS, by validation loss, tethered to their seed)
    mechanisms = tethered_children(programs, "residual_term")[:MECHANISMS]
    scored = losses()
    wanted = [*pareto_front(programs), *seeds, *mechanisms]
    missing = list({p.id: p for p in wanted if p.id not in scored}.values())
    if not missing:
        return scored
    say(
        f"cross-validating {len(missing)} program(s), the front, the seeds and the tethered residual_term "
        f"children, {protocol} (--front-cv none skips this)"
    )
    cross_validate_programs(archive, missing, loaded, pool, protocol, fit, say=say)
    return losses()


def guard_question(
    archive: Archive,
    run_id: int,
    loaded: LoadedData,
    pool: ReplayPool,
    protocol: str,
    fit: RunFitSettings,
    say: Say = quiet,
) -> list[int]:
    """Cross-validate under `protocol` the child `guarded` would deploy and its own seed, where either
    has no score of it with these settings, and ask again, until it deploys a seed or a child whose
    scores of `protocol` are in (it beat its seed there too, or neither could be scored). The ids
    scored, in order. `guarded` asks every protocol scored, so its pick is the one it would make with
    the whole front and every seed scored under `protocol` too, at the cost of the programs it reaches
    (on the real data: two, where the front and the seeds are fifteen)."""
    wanted = fit.settings(protocol)
    asked: list[int] = []
    while True:
        pick = choose(archive, "guarded").program
        programs = archive.programs(run_id)
        seed = own_seed(pick, {p.id: p for p in programs})
        if pick.id == seed.id:
            return asked
        have = {
            s.program_id for s in archive.cv_scores(run_id=run_id) if s.protocol == protocol and s.settings() == wanted
        }
        missing = [p for p in (pick, seed) if p.id not in have]
        if not missing:
            return asked
        say(
            f"guarded would deploy #{pick.id}: asking it and its seed #{seed.id} a second question, "
            f"{protocol} (--guard-cv none skips this)"
        )
        cross_validate_programs(archive, missing, loaded, pool, protocol, fit, say=say)
        asked += [p.id for p in missing]
