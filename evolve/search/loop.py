"""The search loop (the scheduler between the archive and the emitters, as pyribs' scheduler).

Generation 0 fits every seed. Each later generation, read top to bottom:
  1. propose: parents come from the current island's MAP-Elites grid and Pareto front; an
     emitter (symbolic operators, an LLM, ...; see emitters.py) proposes each child;
  2. admit: every child goes through the DSL validator and (with `units="check"`) the units
     check; invalid ones and duplicates are rejected with their reason, and the emitter is told;
  3. screen and promote (the evaluation cascade, cascade.py): every child gets a quick fit; the
     archive says which children would open a cell or improve on its elites, and only those get
     the full fit on all experiments and the validation replay;
  4. tell each emitter what became of its children, and commit: everything the generation
     produced is written to the archive in one transaction, and kept in memory.
A generation is a deterministic function of (seed, generation, archive so far): random
streams are derived from the seed and the generation, never shared across generations, and a
resumed run reads back from the archive what the uninterrupted run kept, so it redoes an
interrupted generation exactly.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections import Counter
from collections.abc import Callable

from stepml_evolve.archive.map_elites import Elites, best, pareto_front
from stepml_evolve.archive.records import (
    GenerationRecord,
    LLMCallRecord,
    NewProgram,
    ProgramRecord,
    RejectionRecord,
    refit_of,
)
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import Program, ProgramError, check_units, compile_program, parse_program
from stepml_evolve.evaluator.fit.fitting import FAILED_LOSS, FAILED_REASON
from stepml_evolve.evaluator.hardware.components import dropped_time_components, unexercised_components
from stepml_evolve.evaluator.physics.floor import envelope_for
from stepml_evolve.evaluator.physics.rules import inherit, physics_problems
from stepml_evolve.evaluator.replay.closed_loop import experiment_coefficients
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evaluator.seeding import mix
from stepml_evolve.seeds import seed_paths

from .cascade import Candidate, Cascade, Judgement, program_record, structure_hash
from .emitters import ARCHIVED, DUPLICATE, EVALUATION_FAILED, INVALID, AskContext, Emitter, Proposal, SymbolicEmitter
from .selection import select_parent
from .settings import RunSettings, SearchConfig, SearchError, check_seed_units
from .simplify import simplify

PASSED_DUPLICATE_FILTER = ("evaluation",)  # rejection rules applied after the duplicate check
PATIENCE_GAIN = 0.005  # --patience counts generations since the best validation loss last fell by more than 0.5%
LOSSES = ("quick_loss", "screen_loss", "train_loss", "val_loss", "test_loss")  # a ProgramRecord's REAL columns

ProgressFn = Callable[[dict], None]


class Search:
    def __init__(
        self,
        archive: Archive,
        data: LoadedData,
        pool: ReplayPool,
        config: SearchConfig,
        emitters: list[Emitter] | None = None,
        progress: ProgressFn | None = None,
        resume: bool = False,
        run_config: dict | None = None,
        seeds: list[tuple[str, str]] | None = None,
        seeds_checked: bool = False,
    ):
        """emitters: who proposes children, the first being the default (symbolic when None); any
        other is asked for its `share` of the children while `available()`. seeds: (name, source)
        of the generation-0 programs; None for the shipped seeds/. seeds_checked: their units were
        checked already (`evolve run` checks --seed-programs files as it reads them, naming the file)."""
        self.archive, self.cfg = archive, config
        self.seeds = seeds if seeds is not None else [(p.stem, p.read_text()) for p in seed_paths()]
        self.emitters: list[Emitter] = emitters or [
            SymbolicEmitter(config.modulate, config.switch, causal=config.physics == "check")
        ]
        self.progress = progress or (lambda info: None)
        self.cascade = Cascade(data, pool, config)
        self.unexercised = (
            unexercised_components([experiment_coefficients(e) for e in data.experiments])
            if config.unexercised == "reject"
            else []
        )
        # --physics check: the envelope every seed and child is held to (the catalog's deployments
        # and the data's)
        self.envelope = envelope_for(data.experiments) if config.physics == "check" else None
        settings = RunSettings.of(config, (run_config or {}).get("llm"), seeds)
        run = archive.run()
        if run is None:
            if config.units == "check" and not seeds_checked:
                check_seed_units(self.seeds)  # before anything is stored
            self.run_id = archive.create_run(
                data.label,
                data.fingerprint(),
                data.synthetic,
                config.seed,
                {**(run_config or {}), **settings.to_json(), "generations": config.generations},
            )
        else:
            settings.check_resume(archive, run, data, resume)
            self.run_id = run.id
        # What the run wrote so far, kept up to date by `commit`: read back here, so a resumed run
        # starts from what an uninterrupted one held.
        self.programs: list[ProgramRecord] = archive.programs(self.run_id)
        # (generation, best validation loss) of each completed generation
        self.completed: list[tuple[int, float | None]] = [
            (g.generation, g.best_val) for g in archive.generations(self.run_id)
        ]
        rejected = archive.rejections(self.run_id)
        # The duplicate filter holds every structure that passed it (archived programs, seeds
        # included, and children that then failed evaluation): rebuilt here exactly as a live run
        # grows it, so a resumed run makes the same choices as an uninterrupted one.
        self.structures = {structure_hash(parse_program(p.source)) for p in self.programs}
        self.structures |= {
            structure_hash(parse_program(r.source)) for r in rejected if r.rule in PASSED_DUPLICATE_FILTER and r.source
        }
        self.rejection_counts = Counter(r.rule for r in rejected)
        self.started = time.perf_counter()
        for e in self.emitters:
            e.resume(archive, self.run_id)

    # ---- a generation: propose, admit, screen, promote, tell, commit ----
    def _generation_zero(self) -> GenerationRecord:
        t0 = time.perf_counter()
        programs: list[NewProgram] = []
        rejections: list[RejectionRecord] = []
        progs = [parse_program(source) for _, source in self.seeds]
        self.structures |= {structure_hash(prog) for prog in progs}
        sound = []
        for (
            name,
            source,
        ) in self.seeds:  # --physics check: a seed below the floor (BLIS's blackbox) is not searched from
            problems = physics_problems(parse_program(source), self.envelope) if self.envelope is not None else []
            if problems:
                rule, message = problems[0]
                rejections.append(
                    RejectionRecord(
                        operator="seed", parents=[], rule=rule, source=source, reason=f"seed program {name}: {message}"
                    )
                )
                self.progress(
                    {
                        "generation": 0,
                        "message": f"seed program {name}: rejected by --physics check ({rule}): {message}",
                    }
                )
            sound.append(not problems)
        kept = [(i, seed, prog) for i, (seed, prog) in enumerate(zip(self.seeds, progs)) if sound[i]]
        fulls = self.cascade.seed_fits([prog for _, _, prog in kept])
        for (i, (name, source), prog), full in zip(kept, fulls):
            if not full.train_loss < FAILED_LOSS:  # NaN or non-positive step times whatever the constants
                rejections.append(
                    RejectionRecord(
                        operator="seed",
                        parents=[],
                        rule="evaluation",
                        source=source,
                        reason=f"seed program {name}: {FAILED_REASON}",
                    )
                )
                self.progress(
                    {
                        "generation": 0,
                        "message": f"seed program {name}: rejected (step_time non-finite or non-positive)",
                    }
                )
                continue
            seed = Proposal("seed", [], source, name)
            programs.append(program_record(prog, full.constants, seed, i % self.cfg.islands, "seed", full=full))
            self.progress({"generation": 0, "message": f"seed program {name}: val loss {full.val_loss:.3f}"})
        if not programs:
            raise SearchError(f"none of the seed programs can be evaluated ({'; '.join(r.reason for r in rejections)})")
        return self.commit(
            0, t0, programs, rejections, [], GenerationRecord(n_children=len(self.seeds), n_promoted=len(programs))
        )

    def _generation(self, g: int) -> GenerationRecord:
        t0 = time.perf_counter()
        island = g % self.cfg.islands
        elites = Elites.of([p for p in self.programs if p.island == island])
        rejections: list[RejectionRecord] = []
        llm_calls: list[LLMCallRecord] = []
        for e in self.emitters:
            e.begin(g)
        cands = [c for i in range(self.cfg.children) if (c := self._propose(g, i, elites, rejections, llm_calls))]
        self.cascade.screen([(c, (g, i)) for i, c in enumerate(cands)])
        failed = [c for c in cands if not c.quick_loss < FAILED_LOSS]
        for c in failed:
            rejections.append(c.failed())
            c.emitter.tell(c.proposal, EVALUATION_FAILED)
        cands = [c for c in cands if c not in failed]
        promoted = self.cascade.promotion_order(cands, elites)
        to_fit = [(c, (g, i)) for i, c in enumerate(cands) if c in promoted]
        fulls = dict(zip([c for c, _ in to_fit], self.cascade.full_fits(to_fit)))
        programs: list[NewProgram] = []
        for c in cands:
            if c in fulls:
                new = program_record(
                    c.program, fulls[c].constants, c.proposal, c.island, "full", c.quick_loss, fulls[c]
                )
            else:
                new = program_record(c.program, c.constants, c.proposal, c.island, "screened", c.quick_loss)
            c.emitter.tell(c.proposal, ARCHIVED, len(programs))
            programs.append(new)
        if self.cfg.islands > 1 and g % self.cfg.migration_interval == 0:
            programs.extend(self._migrants())
        return self.commit(
            g,
            t0,
            programs,
            rejections,
            llm_calls,
            GenerationRecord(n_children=self.cfg.children, n_promoted=len(promoted)),
        )

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

    def _propose(
        self, g: int, i: int, elites: Elites, rejections: list[RejectionRecord], llm_calls: list[LLMCallRecord]
    ) -> Candidate | None:
        rng = random.Random(mix(self.cfg.seed, g, i))
        parent, how = select_parent(rng, elites.grid, elites.front)
        emitter = self._choose_emitter(rng)
        proposal = emitter.ask(AskContext(g, i, rng, parent, parse_program(parent.source), how, elites, self.archive))
        llm_calls.extend(proposal.llm_calls)
        if proposal.notice:
            self.progress({"generation": g, "message": proposal.notice, "notice": True})
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
                check_units(child)  # on the child as proposed, so a rejection's line is the proposal's
            if self.envelope is not None:  # --physics check: the parent's bounds and priors, then simplified
                if (parent := self._first_parent(proposal)) is not None:
                    child = inherit(child, parse_program(parent.source), self.envelope)
                child, simplified = simplify(child)
                if simplified:
                    proposal.detail += f" (simplified: {'; '.join(simplified)})"
                    if self.cfg.units == "check":
                        check_units(child)
        except ProgramError as e:
            return RejectionRecord(**reject, rule=e.rule, reason=str(e))
        if self.envelope is not None and (problems := physics_problems(child, self.envelope)):
            rule, message = problems[0]
            return RejectionRecord(**reject, rule=rule, reason=message)
        if self.cfg.time_components == "keep" and (dropped := self._dropped_time_components(child, proposal)):
            return RejectionRecord(**reject, rule="time-components", reason=dropped)
        if self.unexercised and (more := self._new_unexercised_uses(child, proposal)):
            return RejectionRecord(**reject, rule="unexercised", reason=more)
        h = structure_hash(child)
        if h in self.structures and not proposal.reuses_structure:
            return RejectionRecord(
                **reject, rule="duplicate", reason="same structure as a program already in the archive"
            )
        self.structures.add(h)
        return child

    def _first_parent(self, proposal: Proposal) -> ProgramRecord | None:
        return next((p for p in self.programs if p.id == proposal.parents[0]), None) if proposal.parents else None

    def _dropped_time_components(self, child: Program, proposal: Proposal) -> str:
        """Why the child may not be admitted with --time-components keep: the time components its
        first parent uses and it does not ("" when none)."""
        parent = self._first_parent(proposal)
        if parent is None:
            return ""
        dropped = dropped_time_components(parent.components, child.components_used)
        if not dropped:
            return ""
        return f"drops {', '.join('f.' + c for c in dropped)}, which its parent #{parent.id} uses"

    def _new_unexercised_uses(self, child: Program, proposal: Proposal) -> str:
        """Why the child may not be admitted with --unexercised reject: the components the data
        never varies that it uses more often than its first parent ("" when none)."""
        parent = self._first_parent(proposal)
        if parent is None:
            return ""
        before, after = parse_program(parent.source).component_uses, child.component_uses
        more = [c for c in self.unexercised if after[c] > before[c]]
        if not more:
            return ""
        uses = ", ".join(f"f.{c} {after[c]} times (its parent #{parent.id}: {before[c]})" for c in more)
        return f"uses {uses}, which never varies in the data: no fit can judge the change"

    def _migrants(self) -> list[NewProgram]:
        """Each island's best program, copied into the next island."""
        out = []
        n = self.cfg.islands
        for i in range(n):
            top = best([p for p in self.programs if p.island == i])
            if top is None:
                continue
            record = dataclasses.replace(
                top,
                id=None,
                parents=[top.id],
                operator="migration",
                operator_detail=f"island {i} -> {(i + 1) % n}",
                island=(i + 1) % n,
                stage="full",
            )
            out.append(NewProgram(record, self.archive.metric_rows(top.id)))
        return out

    def commit(
        self,
        generation: int,
        t0: float,
        programs: list[NewProgram],
        rejections: list[RejectionRecord],
        llm_calls: list[LLMCallRecord],
        stats: GenerationRecord,
    ) -> GenerationRecord:
        """Write one generation (this loop's, or an outside engine's) in one transaction and keep
        its programs in `programs`; returns its record. t0: when it started (time.perf_counter())."""
        scored = [(p.val_loss, p.train_loss) for p in self.programs if p.full and p.val_loss is not None]
        scored += [(p.record.val_loss, p.record.train_loss) for p in programs if p.record.val_loss is not None]
        scored = [s for s in scored if math.isfinite(s[0])]
        top = min(scored) if scored else (None, None)
        stats = dataclasses.replace(
            stats,
            n_rejected=len(rejections),
            evaluations=self.cascade.take_evaluations(),
            best_val=top[0],
            best_train=top[1],
        )
        ids = self.archive.write_generation(
            self.run_id, generation, time.perf_counter() - t0, programs, rejections, llm_calls, stats
        )
        self.programs += [_as_read_back(p.record, pid, self.run_id, generation) for p, pid in zip(programs, ids)]
        self.rejection_counts.update(r.rule for r in rejections)
        self.completed.append((generation, stats.best_val))
        return stats

    # ---- an outside engine (evolve/openevolve/engine.py) hands its children over one at a time ----
    def judge(self, proposal: Proposal, island: int | None = None) -> Judgement:
        """One child through admission (validator, units, duplicate filter) and the cascade
        (`Cascade.judge`) against this run's programs; `commit` then writes it as a generation."""
        child = self._admit(proposal)
        if isinstance(child, RejectionRecord):
            return Judgement(None, child, math.inf)
        return self.cascade.judge(child, proposal, self.programs, island)

    # ---- the run ----
    def last_generation(self) -> int:
        """The last completed generation (-1: none yet)."""
        return self.completed[-1][0] if self.completed else -1

    def status(self, generation: int) -> dict:
        top = best(self.programs)
        elapsed = time.perf_counter() - self.started
        info = {
            "generation": generation,
            "programs": len(self.programs),
            "full": sum(p.full for p in self.programs),
            "best_train": top.train_loss if top else None,
            "best_val": top.val_loss if top else None,
            "rejections": dict(self.rejection_counts),
            "elapsed_s": elapsed,
        }
        for e in self.emitters:
            info.update(e.status())
        return info

    def run(self, until: int | None = None) -> dict:
        """Complete the generations up to `until` (default: the configured number); returns the summary it stored."""
        for g in range(self.last_generation() + 1, (self.cfg.generations if until is None else until) + 1):
            if self.out_of_patience():
                break
            self.archive.check_still_there()  # not a generation's work for an archive deleted under the run
            t0 = time.perf_counter()
            done = self._generation_zero() if g == 0 else self._generation(g)
            info = self.status(g)
            info["evals_per_s"] = done.evaluations / max(time.perf_counter() - t0, 1e-9)
            self.progress(info)
        summary = self.summary()
        self.archive.set_summary(self.run_id, summary)
        return summary

    def out_of_patience(self) -> bool:
        """--patience: whether the best validation loss has not fallen by more than PATIENCE_GAIN
        (relative) in the last `patience` completed generations (a resumed run reads them back from
        the archive, so it stops where an uninterrupted one would)."""
        if not self.cfg.patience:
            return False
        best_val, since = math.inf, 0
        for generation, val in self.completed:
            if val is not None and val < best_val * (1 - PATIENCE_GAIN):
                best_val, since = val, generation
        return bool(self.completed) and self.last_generation() - since >= self.cfg.patience

    def summary(self) -> dict:
        top = best(self.programs)
        front = pareto_front(self.programs)
        out = {
            "generations": self.last_generation(),
            "programs": len(self.programs),
            "fully_evaluated": sum(p.full for p in self.programs),
            "rejections": dict(self.rejection_counts),
            "stopped_by_patience": self.out_of_patience() and self.last_generation() < self.cfg.generations,
            "front": [
                {"id": p.id, "complexity": p.complexity, "val_loss": p.val_loss, "operator": p.operator} for p in front
            ],
        }
        if top is not None:
            rows = self.archive.metric_rows(top.id, "test")
            out["best"] = {
                "id": top.id,
                "val_loss": top.val_loss,
                "train_loss": top.train_loss,
                "test_loss": top.test_loss,
                "complexity": top.complexity,
                "operator": top.operator,
                "refit_of": refit_of(self.programs).get(top.id),
                "generation": top.generation,
                "test": [{"name": r.name, "n_requests": r.n_requests, "ape": dataclasses.asdict(r.ape)} for r in rows],
            }
        return out


def _as_read_back(record: ProgramRecord, program_id: int, run_id: int, generation: int) -> ProgramRecord:
    """A program just written, as the archive reads it back: a loss that is not a number is stored
    as NULL (so a program whose validation loss is NaN is not fully evaluated), every loss as a float."""
    losses = {k: None if (v := getattr(record, k)) is None or v != v else float(v) for k in LOSSES}
    return dataclasses.replace(record, id=program_id, run_id=run_id, generation=generation, **losses)
