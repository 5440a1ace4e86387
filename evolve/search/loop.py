"""The search loop (the scheduler between the archive and the emitters).

Generation 0 fits every seed. Each later generation, read top to bottom:
  1. parents come from the current island's MAP-Elites grid and Pareto front;
  2. an emitter (symbolic operators, an LLM, ...; see emitters.py) proposes each child; every
     child goes through the DSL validator and (with `units="check"`) the units check; invalid
     ones and duplicates are rejected with their reason, and the emitter is told;
  3. cascade: every child gets a quick fit (one experiment per model, short window, small
     budget, warm start); the archive says which children would open a cell or improve on its
     elites (`Elites.status`), and only those get the full fit on all experiments and the
     validation replay;
  4. everything the generation produced is written to the archive in one transaction.
A generation is a deterministic function of (seed, generation, archive so far): random
streams are derived from the seed and the generation, never shared across generations, so a
resumed run redoes an interrupted generation exactly.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import math
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from stepml_evolve.archive.grid import AddStatus, Elites, best, pareto_front
from stepml_evolve.archive.records import (CVEvaluationRecord, CVScoreRecord, GenerationRecord, LLMCallRecord, NewProgram, ProgramRecord,
                             RejectionRecord)
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.crossval import PROTOCOLS, CrossValidation, cross_validate, make_folds
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import Program, ProgramError, check_units, compile_program, parse_program
from stepml_evolve.evaluator.engine import Engine
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.experiments import SPLITS
from stepml_evolve.evaluator.fitting import FAILED_LOSS, FAILED_REASON, METHODS, FitConfig, FitResult, fit, fit_experiments, quick_config
from stepml_evolve.evaluator.metrics import MetricRow
from stepml_evolve.evaluator.objectives import Objective
from stepml_evolve.evaluator.prompt_reuse import DEFAULT_POLICY as DEFAULT_PROMPT_REUSE, LEGACY_POLICY as LEGACY_PROMPT_REUSE
from stepml_evolve.evaluator.replay import DEFAULT_SEMANTICS
from stepml_evolve.seeds import seed_paths

from .emitters import ARCHIVED, DUPLICATE, EVALUATION_FAILED, INVALID, AskContext, Emitter, Proposal, SymbolicEmitter
from .selection import select_parent

PASSED_DUPLICATE_FILTER = ("evaluation",)  # rejection rules applied after the duplicate check
CV_MODES = ("none", *PROTOCOLS)  # --cv: what a full fit's validation loss is (none: the validation windows)
FRONT_CV_MODES = (*PROTOCOLS, "none")  # --front-cv: how the Pareto front is cross-validated when a run ends
UNITS_MODES = ("check", "off")  # check: seeds and children must be unit-consistent (evaluator/dsl/units.py)


@dataclass(frozen=True)
class SearchConfig:
    generations: int = 500
    seed: int = 7
    children: int = 8  # per generation
    llm_ratio: float = 0.5  # share of children asked of the LLM (when one is configured)
    max_promotions: int = 2  # full fits per generation at most (they dominate a generation's time)
    promote_margin: float = 0.05  # promote when the quick loss is within 5% of the reference it must beat
    sanity_factor: float = 3.0  # never promote a quick loss above 3x the best screening loss
    quick_evals: int | None = None  # screening fit budget per child (closed-loop evaluations; None: the method's default)
    full_fit_evals: int | None = 12  # closed-loop evaluations of a promoted child's fit (None: the method's default)
    full_fit_sigma: float = 0.2
    seed_fit_evals: int | None = None  # None: the standard fit budget
    islands: int = 1
    migration_interval: int = 25
    semantics: str = DEFAULT_SEMANTICS  # how the replay accounts a step: "blis" or "vllm"
    prompt_reuse: str = DEFAULT_PROMPT_REUSE  # which requests shared prompts (evaluator/prompt_reuse.py)
    fit_method: str = METHODS[0]
    objective: str = "rms"
    weights: tuple[tuple[str, float], ...] = ()  # (experiment-name pattern, weight); see evaluator/objectives.py
    patience: int | None = None  # stop after this many generations without a 0.5% gain in best validation loss
    units: str = UNITS_MODES[0]  # "check": reject a seed or child whose step time is not a time; "off"
    cv: str = CV_MODES[0]  # lomo/lowo: a full fit is the fold fits too, and its validation loss is the CV loss
    front_cv: str = FRONT_CV_MODES[0]  # the protocol the front is scored with at the end of the run ("none": not)

    def __post_init__(self):
        for name, modes in (("units", UNITS_MODES), ("cv", CV_MODES), ("front_cv", FRONT_CV_MODES)):
            if getattr(self, name) not in modes:
                raise ValueError(f"{name} must be one of {', '.join(modes)}, not {getattr(self, name)!r}")

    def identity(self) -> dict:
        """Settings that shape the archive: a resumed run must use the same (as stored: JSON)."""
        d = dataclasses.asdict(self)
        for k in NOT_IDENTITY:
            d.pop(k)
        return json.loads(json.dumps(d))

    def goal(self) -> Objective:
        return Objective(self.objective, self.weights)


NOT_IDENTITY = ("generations", "patience", "front_cv")  # a resumed run may change these
# settings added after runs were first stored: an archive without them ran with these values
LEGACY_SETTINGS = {"fit_method": "cmaes", "objective": "rms", "weights": [], "units": "off", "cv": "none",
                   "prompt_reuse": LEGACY_PROMPT_REUSE}


def stored_settings(run_config: dict | None) -> dict:
    """A stored run's search settings, with the legacy value of each setting it predates."""
    return {**LEGACY_SETTINGS, **((run_config or {}).get("search") or {})}


PATIENCE_GAIN = 0.005  # --patience counts generations since the best validation loss last fell by more than 0.5%


class SearchError(UserError, RuntimeError):
    """The search cannot go on; the message is one line."""


def _differences(saved: dict, now: dict) -> str:
    """'children: run 5, now 7; seeds: ...' for the settings that differ."""
    def flat(d):  # the search settings side by side with the others
        return {**{k: v for k, v in (d or {}).items() if k != "search"}, **((d or {}).get("search") or {})}
    a, b = flat(saved), flat(now)
    return "; ".join(f"{k.replace('_', '-')}: run {a.get(k)}, now {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def _mix(*parts: int) -> int:
    h = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(h[:8], "little")


def structure_hash(program: Program) -> str:
    """Identity of a program's structure: its functions' ASTs, constant names and bounds, not values
    (an unbounded program hashes as it did before bounds existed)."""
    dump = [ast.dump(program.functions[n]) for n in sorted(program.functions)] + sorted(program.constants)
    dump += [f"{k} in [{lo!r}, {hi!r}]" for k, (lo, hi) in sorted(program.bounds.items())]
    return hashlib.sha256("\n".join(dump).encode()).hexdigest()[:20]


@dataclass(eq=False)
class Candidate:
    """A valid child in the evaluation cascade."""

    program: Program
    proposal: Proposal
    emitter: Emitter | None  # None: judged for an outside engine (Search.judge)
    island: int
    quick_loss: float = math.nan
    constants: dict[str, float] = dataclasses.field(default_factory=dict)

    def failed(self) -> RejectionRecord:
        """Its rejection when the quick fit found no finite, positive step times."""
        return RejectionRecord(operator=self.proposal.operator, parents=self.proposal.parents, rule="evaluation",
                               reason=FAILED_REASON, source=self.program.source)


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
    """What `Search.judge` made of one child: an archivable program or a rejection, and the loss an
    outside engine ranks it by (its validation loss; estimated for a screened child; inf if rejected)."""

    program: NewProgram | None
    rejection: RejectionRecord | None
    loss: float

    @property
    def promoted(self) -> bool:
        """Fully evaluated (a promoted child, or an archived seed OpenEvolve starts from)."""
        return self.program is not None and self.program.record.full


ProgressFn = Callable[[dict], None]


class Search:
    def __init__(self, archive: Archive, data: LoadedData, engine: Engine, config: SearchConfig,
                 emitters: list[Emitter] | None = None, progress: ProgressFn | None = None, resume: bool = False,
                 run_config: dict | None = None, seeds: list[tuple[str, str]] | None = None):
        """emitters: who proposes children, the first being the default (symbolic when None); any
        other is asked for its `share` of the children while `available()`. seeds: (name, source)
        of the generation-0 programs; None for the shipped seeds/."""
        self.archive, self.data, self.engine, self.cfg = archive, data, engine, config
        self.seeds = seeds if seeds is not None else [(p.stem, p.read_text()) for p in seed_paths()]
        self.emitters: list[Emitter] = emitters or [SymbolicEmitter()]
        self.progress = progress or (lambda info: None)
        self.exps = data.experiments
        self.goal = config.goal()
        self.folds = make_folds(config.cv, self.exps) if config.cv != "none" else None  # the data must allow them
        quick = quick_config(0, self.exps, config.fit_method)
        self.quick = dataclasses.replace(quick, objective=self.goal, max_evals=config.quick_evals or quick.max_evals)
        self.screen_exps = fit_experiments(self.exps, self.quick)
        run = archive.run()
        # custom seeds are part of a run's identity (by content); the shipped ones are recorded as None
        seed_ids = None if seeds is None else {name: hashlib.sha256(src.encode()).hexdigest()[:16] for name, src in seeds}
        identity = {"search": config.identity(), "llm": (run_config or {}).get("llm"), "seeds": seed_ids}
        if run is None:
            self._check_seed_units()
            self.run_id = archive.create_run(data.label, data.fingerprint(), data.synthetic, config.seed,
                                             {**(run_config or {}), **identity, "generations": config.generations})
        else:
            if not resume:
                raise SearchError(f"{archive.dir} already holds a run ({archive.last_generation(run.id) + 1} generations "
                                  "completed): pass --resume to continue it, or choose another --archive")
            if run.data_fingerprint != data.fingerprint():
                raise SearchError(f"{archive.dir}: the run used other data ({run.data_label}); cannot resume on {data.label}")
            saved = {k: run.config.get(k) for k in identity}
            if saved.get("search") is not None:
                saved["search"] = {**LEGACY_SETTINGS, **saved["search"]}
            if saved != identity:
                raise SearchError(f"{archive.dir}: the run used other search settings ({_differences(saved, identity)}); "
                                  "resume with the settings it started with")
            self.run_id = run.id
        self.programs: list[ProgramRecord] = archive.programs(self.run_id)
        rejected = archive.rejections(self.run_id)
        # The duplicate filter holds every structure that passed it (archived programs, seeds
        # included, and children that then failed evaluation): rebuilt here exactly as a live run
        # grows it, so a resumed run makes the same choices as an uninterrupted one.
        self.structures = {structure_hash(parse_program(p.source)) for p in self.programs}
        self.structures |= {structure_hash(parse_program(r.source)) for r in rejected
                            if r.rule in PASSED_DUPLICATE_FILTER and r.source}
        self.rejection_counts = Counter(r.rule for r in rejected)
        self.evaluations = 0
        self._counting = threading.Lock()
        self.started = time.perf_counter()
        for e in self.emitters:
            e.resume(archive, self.run_id)

    def _check_seed_units(self) -> None:
        """With units="check", every seed must be unit-consistent (before anything is stored)."""
        if self.cfg.units != "check":
            return
        for name, source in self.seeds:
            try:
                check_units(parse_program(source))
            except ProgramError as e:
                raise SearchError(f"seed {name}: {e} (pass --units off to search from it anyway)") from None

    # ---- evaluation cascade ----
    def _each_at_once(self, fit_one: Callable, items) -> list:
        """fit_one over items concurrently, results in item order. Each fit hands its replays to the
        engine, so the executor sees every fit's batches at once (a cluster's workers are busy with
        all children, not one). A fit is a pure function of its program, start, seed and data, so
        the archive is the one sequential fits give."""
        items = list(items)
        if len(items) <= 1:
            return [fit_one(x) for x in items]
        with ThreadPoolExecutor(len(items), thread_name_prefix="fit") as pool:
            return list(pool.map(fit_one, items))

    def _quick_fit(self, program: Program, *where: int) -> FitResult:
        """The screening fit from the program's own constants, seeded by the run's seed and where
        the child stands (generation and index, or its structure)."""
        qcfg = dataclasses.replace(self.quick, seed=_mix(self.cfg.seed, *where, 1) % (2**31))
        res = fit(program, self.exps, self.engine, qcfg, start=program.constants)
        self._count(res.evaluations)
        return res

    def _count(self, evaluations: int) -> None:
        with self._counting:
            self.evaluations += evaluations

    def _full_evaluation(self, program: Program, start: dict[str, float], seed: int, max_evals: int | None,
                         sigma: float) -> FullFit:
        """The fit on every experiment, scored on every split; with --cv also the fold fits (run
        concurrently with it), whose CV loss becomes the validation loss."""
        config = FitConfig(seed=seed, max_evals=max_evals, sigma0=sigma, method=self.cfg.fit_method, objective=self.goal)
        cv: CrossValidation | None = None
        if self.folds:
            t0 = time.perf_counter()
            cv = cross_validate(program, self.exps, self.engine, self.cfg.cv, self.folds, config, start=start,
                                in_distribution=True)
            res = cv.in_distribution.fit  # the same fit as without --cv (same seed, same constants)
            self._count(sum(f.fit.evaluations for f in cv.folds))
            cv_seconds = time.perf_counter() - t0
        else:
            res = fit(program, self.exps, self.engine, config, start=start)
        self._count(res.evaluations)
        consts = res.constants["all"]
        vec = np.array([consts[k] for k in program.constants], dtype=float)
        rows = self.engine.score(program, [vec] * len(self.exps), SPLITS, percentiles=True)
        screen = self.engine.population_losses(compile_program(program), [vec], self.screen_exps, objective=self.goal)[0]
        self._count(2)
        of = self.goal.of_rows
        full = FullFit(consts, of(rows["train"]), of(rows["validate"]), of(rows["test"]), screen,
                       [r for s in SPLITS for r in rows[s]])
        if cv is None:
            return full
        score = CVScoreRecord.of(0, cv, config, self.cfg.semantics, cv_seconds)
        held = [CVEvaluationRecord.of(0, cv.protocol, f.fold.name, r) for f in cv.folds for r in f.rows]
        return dataclasses.replace(full, val_loss=cv.loss, cv=score, cv_rows=held)

    def _program(self, program: Program, constants: dict, proposal: Proposal, island: int, stage: str,
                 quick_loss: float | None = None, full: FullFit | None = None) -> NewProgram:
        fitted = program.with_constants(constants) if constants else program
        record = ProgramRecord(
            id=None, source_hash=structure_hash(program), source=fitted.source, constants=constants,
            parents=proposal.parents, operator=proposal.operator, operator_detail=proposal.detail, island=island,
            complexity=program.complexity, n_components=len(program.components_used),
            components=program.components_used, stage=stage, quick_loss=quick_loss)
        if full is None:
            return NewProgram(record)
        record = dataclasses.replace(record, train_loss=full.train_loss, val_loss=full.val_loss,
                                     test_loss=full.test_loss, screen_loss=full.screen_loss)
        return NewProgram(record, full.rows, full.cv, full.cv_rows)

    def _generation_zero(self) -> None:
        t0 = time.perf_counter()
        programs: list[NewProgram] = []
        rejections: list[RejectionRecord] = []
        progs = [parse_program(source) for _, source in self.seeds]
        self.structures |= {structure_hash(prog) for prog in progs}
        fulls = self._each_at_once(lambda i: self._full_evaluation(progs[i], progs[i].constants, _mix(self.cfg.seed, 0, i) % (2**31),
                                                                  self.cfg.seed_fit_evals, 0.5), range(len(progs)))
        for i, ((name, source), prog, full) in enumerate(zip(self.seeds, progs, fulls)):
            if not full.train_loss < FAILED_LOSS:  # NaN or non-positive step times whatever the constants
                rejections.append(RejectionRecord(operator="seed", parents=[], rule="evaluation", source=source,
                                                  reason=f"seed {name}: {FAILED_REASON}"))
                self.progress({"generation": 0, "message": f"seed {name}: rejected (step_time non-finite or non-positive)"})
                continue
            seed = Proposal("seed", [], source, name)
            programs.append(self._program(prog, full.constants, seed, i % self.cfg.islands, "seed", full=full))
            self.progress({"generation": 0, "message": f"seed {name}: val loss {full.val_loss:.3f}"})
        if not programs:
            raise SearchError(f"none of the seed programs can be evaluated ({'; '.join(r.reason for r in rejections)})")
        self._commit(0, t0, programs, rejections, [], GenerationRecord(n_children=len(self.seeds), n_promoted=len(programs)))

    def _commit(self, generation: int, t0: float, programs: list[NewProgram], rejections: list[RejectionRecord],
                llm_calls: list[LLMCallRecord], stats: GenerationRecord) -> None:
        scored = [(p.val_loss, p.train_loss) for p in self.programs if p.full and p.val_loss is not None]
        scored += [(p.record.val_loss, p.record.train_loss) for p in programs if p.record.val_loss is not None]
        scored = [s for s in scored if math.isfinite(s[0])]
        top = min(scored) if scored else (None, None)
        stats = dataclasses.replace(stats, n_rejected=len(rejections), evaluations=self.evaluations,
                                    best_val=top[0], best_train=top[1])
        ids = self.archive.write_generation(self.run_id, generation, time.perf_counter() - t0, programs, rejections,
                                            llm_calls, stats)
        self.programs.extend(self.archive.program(pid) for pid in ids)
        self.rejection_counts.update(r.rule for r in rejections)
        self.evaluations = 0

    def _choose_emitter(self, rng: random.Random) -> Emitter:
        """The first emitter is the default; each other one takes its share while it is available."""
        default = self.emitters[0]
        if len(self.emitters) == 1:
            return default
        r, acc = rng.random(), 0.0
        for e in self.emitters[1:]:
            acc += e.share
            if r < acc:
                return e if e.available() else default
        return default

    def _propose(self, g: int, i: int, elites: Elites, rejections: list[RejectionRecord],
                 llm_calls: list[LLMCallRecord]) -> Candidate | None:
        rng = random.Random(_mix(self.cfg.seed, g, i))
        parent, how = select_parent(rng, elites.grid, elites.front)
        emitter = self._choose_emitter(rng)
        proposal = emitter.ask(AskContext(g, i, rng, parent, parse_program(parent.source), how, elites, self.archive))
        llm_calls.extend(proposal.llm_calls)
        if proposal.source is None:
            rejections.append(proposal.rejection)
            return None
        child = self._admit(proposal)
        if isinstance(child, RejectionRecord):
            rejections.append(child)
            emitter.tell(proposal, DUPLICATE if child.rule == "duplicate" else INVALID)
            return None
        return Candidate(child, proposal, emitter, g % self.cfg.islands)

    def _admit(self, proposal: Proposal) -> Program | RejectionRecord:
        """A proposed child through the validator, the units check and the duplicate filter: the
        program (its structure now counts as seen), or the rejection with its rule."""
        reject = dict(operator=proposal.operator, parents=proposal.parents, source=proposal.source)
        try:
            child = parse_program(proposal.source)
            compile_program(child)
            if self.cfg.units == "check":
                check_units(child)
        except ProgramError as e:
            return RejectionRecord(**reject, rule=e.rule, reason=str(e))
        h = structure_hash(child)
        if h in self.structures and not proposal.reuses_structure:
            return RejectionRecord(**reject, rule="duplicate", reason="same structure as a program already in the archive")
        self.structures.add(h)
        return child

    def judge(self, proposal: Proposal, island: int | None = None) -> Judgement:
        """One child through the whole cascade on its own, for an engine that hands children over one
        at a time (evolve/openevolve/engine.py): validation, units and duplicate filter, quick fit,
        promotion against its island's elites (as `_promotion_order`), full fit. Its fits are seeded
        by the run's seed and the child's structure, so the same child is judged the same way.
        island None: against the elites of every island (the record says island 0)."""
        child = self._admit(proposal)
        if isinstance(child, RejectionRecord):
            return Judgement(None, child, math.inf)
        key = int(structure_hash(child), 16)
        res = self._quick_fit(child, key)
        cand = Candidate(child, proposal, None, island or 0, res.loss, res.constants["all"])
        if not cand.quick_loss < FAILED_LOSS:
            return Judgement(None, cand.failed(), math.inf)
        elites = Elites.of([p for p in self.programs if island is None or p.island == island])
        if self._promotion_order([cand], elites):
            full = self._full_evaluation(child, cand.constants, _mix(self.cfg.seed, key, 2) % (2**31),
                                         self.cfg.full_fit_evals, self.cfg.full_fit_sigma)
            return Judgement(self._program(child, full.constants, proposal, cand.island, "full", cand.quick_loss, full),
                             None, full.val_loss)
        # not promoted: its validation loss is estimated from its quick loss, scaled as the best
        # program's validation loss is to its screening loss (both on the screening windows)
        top = best(self.programs)
        scale = top.val_loss / top.screen_loss if top and top.screen_loss and top.val_loss is not None else 1.0
        return Judgement(self._program(child, cand.constants, proposal, cand.island, "screened", cand.quick_loss), None,
                         cand.quick_loss * scale)

    def commit(self, generation: int, seconds: float, programs: list[NewProgram], rejections: list[RejectionRecord],
               llm_calls: list[LLMCallRecord], promoted: int) -> list[ProgramRecord]:
        """Write one generation of an outside engine (one child each); returns its archived programs."""
        before = len(self.programs)
        self._commit(generation, time.perf_counter() - seconds, programs, rejections, llm_calls,
                     GenerationRecord(n_children=1, n_promoted=promoted))
        return self.programs[before:]

    def _promotion_order(self, cands: list[Candidate], elites: Elites) -> list[Candidate]:
        """Children worth a full fit, most promising first: improvements on their cell's elite or
        on the front (by quick loss vs screening loss), then children opening an empty cell."""
        best_screen = elites.best_screen_loss()
        improving, opening = [], []
        for c in cands:
            if not c.quick_loss < self.cfg.sanity_factor * best_screen:
                continue
            status, rank = elites.status(c.program.complexity, len(c.program.components_used), c.quick_loss,
                                         self.cfg.promote_margin)
            if status is AddStatus.NEW_CELL:
                opening.append((rank, c))
            elif status is AddStatus.IMPROVES:
                improving.append((rank, c))
        ordered = [c for _, c in sorted(improving, key=lambda t: t[0])] + [c for _, c in sorted(opening, key=lambda t: t[0])]
        return ordered[: self.cfg.max_promotions]

    def _generation(self, g: int) -> None:
        t0 = time.perf_counter()
        island = g % self.cfg.islands
        elites = Elites.of([p for p in self.programs if p.island == island])
        rejections: list[RejectionRecord] = []
        llm_calls: list[LLMCallRecord] = []
        cands = [c for i in range(self.cfg.children) if (c := self._propose(g, i, elites, rejections, llm_calls))]
        for c, res in zip(cands, self._each_at_once(lambda i: self._quick_fit(cands[i].program, g, i), range(len(cands)))):
            c.quick_loss, c.constants = res.loss, res.constants["all"]
        failed = [c for c in cands if not c.quick_loss < FAILED_LOSS]
        for c in failed:
            rejections.append(c.failed())
            c.emitter.tell(c.proposal, EVALUATION_FAILED)
        cands = [c for c in cands if c not in failed]
        promoted = self._promotion_order(cands, elites)
        programs: list[NewProgram] = []
        to_fit = [i for i, c in enumerate(cands) if c in promoted]
        fulls = dict(zip(to_fit, self._each_at_once(
            lambda i: self._full_evaluation(cands[i].program, cands[i].constants, _mix(self.cfg.seed, g, i, 2) % (2**31),
                                            self.cfg.full_fit_evals, self.cfg.full_fit_sigma), to_fit)))
        for i, c in enumerate(cands):
            if i in fulls:
                full = fulls[i]
                new = self._program(c.program, full.constants, c.proposal, c.island, "full", c.quick_loss, full)
            else:
                new = self._program(c.program, c.constants, c.proposal, c.island, "screened", c.quick_loss)
            c.emitter.tell(c.proposal, ARCHIVED, len(programs))
            programs.append(new)
        if self.cfg.islands > 1 and g % self.cfg.migration_interval == 0:
            programs.extend(self._migrants())
        self._commit(g, t0, programs, rejections, llm_calls,
                     GenerationRecord(n_children=self.cfg.children, n_promoted=len(promoted)))

    def _migrants(self) -> list[NewProgram]:
        """Each island's best program, copied into the next island."""
        out = []
        n = self.cfg.islands
        for i in range(n):
            top = best([p for p in self.programs if p.island == i])
            if top is None:
                continue
            record = dataclasses.replace(top, id=None, parents=[top.id], operator="migration",
                                         operator_detail=f"island {i} -> {(i + 1) % n}", island=(i + 1) % n, stage="full")
            out.append(NewProgram(record, self.archive.metric_rows(top.id)))
        return out

    # ---- the run ----
    def status(self, generation: int) -> dict:
        top = best(self.programs)
        elapsed = time.perf_counter() - self.started
        info = {"generation": generation, "programs": len(self.programs),
                "full": sum(p.full for p in self.programs), "best_train": top.train_loss if top else None,
                "best_val": top.val_loss if top else None, "rejections": dict(self.rejection_counts),
                "elapsed_s": elapsed}
        for e in self.emitters:
            info.update(e.status())
        return info

    def run(self, until: int | None = None) -> dict:
        """Complete the generations up to `until` (default: the configured number); returns the summary it stored."""
        start = self.archive.last_generation(self.run_id) + 1
        for g in range(start, (self.cfg.generations if until is None else until) + 1):
            if self.out_of_patience():
                break
            t0 = time.perf_counter()
            if g == 0:
                self._generation_zero()
            else:
                self._generation(g)
            gens = self.archive.generations(self.run_id)
            done_evals = gens[-1].evaluations if gens else 0
            info = self.status(g)
            info["evals_per_s"] = done_evals / max(time.perf_counter() - t0, 1e-9)
            self.progress(info)
        summary = self.summary()
        self.archive.set_summary(self.run_id, summary)
        return summary

    def out_of_patience(self) -> bool:
        """--patience: whether the best validation loss has not fallen by more than PATIENCE_GAIN
        (relative) in the last `patience` completed generations (read from the archive, so a
        resumed run stops where an uninterrupted one would)."""
        if not self.cfg.patience:
            return False
        gens = self.archive.generations(self.run_id)
        best_val, since = math.inf, 0
        for gen in gens:
            if gen.best_val is not None and gen.best_val < best_val * (1 - PATIENCE_GAIN):
                best_val, since = gen.best_val, gen.generation
        return bool(gens) and gens[-1].generation - since >= self.cfg.patience

    def summary(self) -> dict:
        top = best(self.programs)
        front = pareto_front(self.programs)
        out = {"generations": self.archive.last_generation(self.run_id), "programs": len(self.programs),
               "fully_evaluated": sum(p.full for p in self.programs), "rejections": dict(self.rejection_counts),
               "stopped_by_patience": self.out_of_patience() and self.archive.last_generation(self.run_id) < self.cfg.generations,
               "front": [{"id": p.id, "complexity": p.complexity, "val_loss": p.val_loss, "operator": p.operator} for p in front]}
        if top is not None:
            rows = self.archive.metric_rows(top.id, "test")
            out["best"] = {"id": top.id, "val_loss": top.val_loss, "train_loss": top.train_loss, "test_loss": top.test_loss,
                           "complexity": top.complexity, "operator": top.operator, "generation": top.generation,
                           "test": [{"name": r.name, "n_requests": r.n_requests, "ape": dataclasses.asdict(r.ape)}
                                    for r in rows]}
        return out


__all__ = ["Judgement", "Search", "SearchConfig", "SearchError", "structure_hash"]
