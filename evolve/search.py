"""The search loop (the scheduler between archive and operators).

Generation 0 fits every seed. Each later generation, read top to bottom:
  1. parents come from the current island's MAP-Elites grid and Pareto front;
  2. children come from the LLM operator (a configurable share, while its budget lasts) or the
     symbolic operators; every child goes through the DSL validator; invalid ones and
     duplicates are rejected with their reason;
  3. cascade: every child gets a quick fit (one experiment per model, short window, small
     budget, warm start); only children that could enter the grid or the front (or fill an
     empty cell) get the full fit on all experiments and the validation replay;
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
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from archive.grid import best, cell_of, elites, pareto_front
from archive.store import Archive, ProgramRecord
from evaluator.datasets import LoadedData
from evaluator.dsl import Program, ProgramError, compile_program, parse_program
from evaluator.engine import Engine
from evaluator.errors import UserError
from evaluator.experiments import SPLITS
from evaluator.fitting import FAILED_LOSS, FAILED_REASON, FitConfig, fit, fit_experiments, quick_config
from evaluator.metrics import loss
from seeds import seed_paths

from .llm_operator import LLMOperator
from .selection import examples_for, select_parent
from .symbolic import OPERATORS, NotRepresentable, mutate

PASSED_DUPLICATE_FILTER = ("evaluation",)  # rejection rules applied after the duplicate check
OPERATOR_WEIGHTS = {"subtree": 0.2, "node_replace": 0.15, "insert": 0.1, "shrink": 0.1, "crossover": 0.15, "constants": 0.1,
                    "add_term": 0.2}


@dataclass(frozen=True)
class SearchConfig:
    generations: int = 500
    seed: int = 7
    children: int = 6  # per generation
    llm_ratio: float = 0.5  # share of children asked of the LLM (when one is configured)
    max_promotions: int = 1  # full fits per generation at most (they dominate a generation's time)
    promote_margin: float = 0.05  # promote when the quick loss is within 5% of the reference it must beat
    sanity_factor: float = 3.0  # never promote a quick loss above 3x the best screening loss
    quick_evals: int = 40  # screening fit budget per child
    full_fit_evals: int = 96
    full_fit_sigma: float = 0.2
    seed_fit_evals: int | None = None  # None: the standard fit budget
    islands: int = 1
    migration_interval: int = 25

    def identity(self) -> dict:
        """Settings that shape the archive: a resumed run must use the same."""
        d = dataclasses.asdict(self)
        d.pop("generations")
        return d


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
    """Identity of a program's structure: its functions' ASTs and constant names, not values."""
    dump = [ast.dump(program.functions[n]) for n in sorted(program.functions)] + sorted(program.constants)
    return hashlib.sha256("\n".join(dump).encode()).hexdigest()[:20]


def _signed_error(predicted: dict, observed: dict, key: str) -> float:
    """(predicted - observed) / observed in percent, NaN where undefined."""
    o, p = observed.get(key), predicted.get(key)
    return (p - o) / o * 100 if o and p is not None else math.nan


@dataclass
class Candidate:
    program: Program
    parents: list[int]
    operator: str
    detail: str
    island: int
    llm_call_indices: list[int] = field(default_factory=list)
    quick_loss: float = math.nan
    constants: dict[str, float] = field(default_factory=dict)
    record: dict = field(default_factory=dict)


ProgressFn = Callable[[dict], None]


class Search:
    def __init__(self, archive: Archive, data: LoadedData, engine: Engine, config: SearchConfig,
                 llm: LLMOperator | None = None, progress: ProgressFn | None = None, resume: bool = False,
                 run_config: dict | None = None, seeds: list[tuple[str, str]] | None = None):
        """seeds: (name, source) of the generation-0 programs; None for the shipped seeds/."""
        self.archive, self.data, self.engine, self.cfg = archive, data, engine, config
        self.seeds = seeds if seeds is not None else [(p.stem, p.read_text()) for p in seed_paths()]
        self.llm, self.progress = llm, progress or (lambda info: None)
        self.exps = data.experiments
        self.quick = dataclasses.replace(quick_config(0, self.exps), max_evals=config.quick_evals)
        self.screen_exps = fit_experiments(self.exps, self.quick)
        run = archive.run()
        # custom seeds are part of a run's identity (by content); the shipped ones are recorded as None
        seed_ids = None if seeds is None else {name: hashlib.sha256(src.encode()).hexdigest()[:16] for name, src in seeds}
        identity = {"search": config.identity(), "llm": (run_config or {}).get("llm"), "seeds": seed_ids}
        if run is None:
            self.run_id = archive.create_run(data.label, data.fingerprint(), data.synthetic, config.seed,
                                             {**(run_config or {}), **identity, "generations": config.generations})
        else:
            if not resume:
                raise RuntimeError(f"{archive.dir} already holds a run ({archive.last_generation(run['id']) + 1} generations "
                                   "completed): pass --resume to continue it, or choose another --archive")
            if run["data_fingerprint"] != data.fingerprint():
                raise RuntimeError(f"{archive.dir}: the run used other data ({run['data_label']}); cannot resume on {data.label}")
            saved = {k: run["config"].get(k) for k in identity}
            if saved != identity:
                raise RuntimeError(f"{archive.dir}: the run used other search settings ({_differences(saved, identity)}); "
                                   "resume with the settings it started with")
            self.run_id = run["id"]
        self.programs: list[ProgramRecord] = archive.programs(self.run_id)
        rejected = archive.rejections(self.run_id)
        # The duplicate filter holds every structure that passed it (archived programs, seeds
        # included, and children that then failed evaluation): rebuilt here exactly as a live run
        # grows it, so a resumed run makes the same choices as an uninterrupted one.
        self.structures = {structure_hash(parse_program(p.source)) for p in self.programs}
        self.structures |= {structure_hash(parse_program(r["source"])) for r in rejected
                            if r["rule"] in PASSED_DUPLICATE_FILTER and r.get("source")}
        self.rejection_counts = Counter(r["rule"] for r in rejected)
        self.evaluations = 0
        self.started = time.perf_counter()
        if llm is not None:
            for c in archive.llm_calls(self.run_id):
                llm.budget.calls += 1
                llm.budget.tokens += c["prompt_tokens"] + c["completion_tokens"]
                llm.budget.usd += c["cost_usd"]

    # ---- evaluation cascade ----
    def _full_evaluation(self, program: Program, start: dict[str, float], seed: int, max_evals: int | None,
                         sigma: float) -> dict:
        res = fit(program, self.exps, self.engine, FitConfig(seed=seed, max_evals=max_evals, sigma0=sigma), start=start)
        self.evaluations += res.evaluations
        consts = res.constants["all"]
        vec = np.array([consts[k] for k in program.constants], dtype=float)
        rows = self.engine.score(program, [vec] * len(self.exps), SPLITS, percentiles=True)
        screen = self.engine.population_losses(compile_program(program), [vec], self.screen_exps)[0]
        self.evaluations += 2
        return {"constants": consts, "train_loss": loss(rows["train"]), "val_loss": loss(rows["validate"]),
                "test_loss": loss(rows["test"]), "screen_loss": screen,
                "evaluations": [r for s in SPLITS for r in rows[s]]}

    def _record(self, program: Program, constants: dict, parents: list[int], operator: str, detail: str,
                island: int, stage: str, **losses) -> dict:
        fitted = program.with_constants(constants) if constants else program
        return {"source_hash": structure_hash(program), "source": fitted.source, "constants": constants,
                "parents": parents, "operator": operator, "operator_detail": detail, "island": island,
                "complexity": program.complexity, "n_components": len(program.components_used),
                "components": program.components_used, "stage": stage, **losses}

    def _generation_zero(self) -> None:
        t0 = time.perf_counter()
        records = []
        rejections = []
        for i, (name, source) in enumerate(self.seeds):
            prog = parse_program(source)
            self.structures.add(structure_hash(prog))
            full = self._full_evaluation(prog, prog.constants, _mix(self.cfg.seed, 0, i) % (2**31), self.cfg.seed_fit_evals, 0.5)
            if not full["train_loss"] < FAILED_LOSS:  # NaN or non-positive step times whatever the constants
                rejections.append({"operator": "seed", "parents": [], "rule": "evaluation", "source": source,
                                   "reason": f"seed {name}: {FAILED_REASON}"})
                self.progress({"generation": 0, "message": f"seed {name}: rejected (step_time non-finite or non-positive)"})
                continue
            rec = self._record(prog, full.pop("constants"), [], "seed", name, i % self.cfg.islands, "seed", **full)
            records.append(rec)
            self.progress({"generation": 0, "message": f"seed {name}: val loss {rec['val_loss']:.3f}"})
        if not records:
            raise SearchError(f"none of the seed programs can be evaluated ({'; '.join(r['reason'] for r in rejections)})")
        self._commit(0, t0, records, rejections, [], {"n_children": len(self.seeds), "n_promoted": len(records)})

    def _commit(self, generation: int, t0: float, records: list[dict], rejections: list[dict], llm_calls: list[dict],
                stats: dict) -> None:
        scored = [(p.val_loss, p.train_loss) for p in self.programs if p.full and p.val_loss is not None]
        scored += [(r["val_loss"], r["train_loss"]) for r in records if r.get("val_loss") is not None]
        scored = [s for s in scored if math.isfinite(s[0])]
        top = min(scored) if scored else (None, None)
        stats = {**stats, "n_rejected": len(rejections), "evaluations": self.evaluations,
                 "best_val": top[0], "best_train": top[1]}
        ids = self.archive.write_generation(self.run_id, generation, time.perf_counter() - t0, records, rejections, llm_calls, stats)
        self.programs.extend(self.archive.program(pid) for pid in ids)
        self.rejection_counts.update(r["rule"] for r in rejections)
        self.evaluations = 0

    def _propose(self, g: int, i: int, grid, front, rejections: list, llm_calls: list) -> Candidate | None:
        rng = random.Random(_mix(self.cfg.seed, g, i))
        island = g % self.cfg.islands
        parent, how = select_parent(rng, grid, front)
        parent_prog = parse_program(parent.source)
        use_llm = self.llm is not None and rng.random() < self.cfg.llm_ratio and self.llm.budget.exhausted() is None
        parents = [parent.id]
        if use_llm:
            operator = f"llm:{self.llm.client.model}"
            rows = self._prompt_rows(parent)
            proposal = self.llm.propose(parent, rows, examples_for(parent, grid, rng), request_tag=f"{g}.{i}")
            llm_calls.extend(a.record() for a in proposal.attempts)
            if proposal.source is None:
                rejections.append({"operator": operator, "parents": parents, "rule": proposal.rule, "reason": proposal.reason})
                return None
            source, detail, call_idx = proposal.source, f"{len(proposal.attempts)} call(s), parent via {how}", [len(llm_calls) - 1]
        else:
            operator = rng.choices(list(OPERATOR_WEIGHTS), weights=list(OPERATOR_WEIGHTS.values()))[0]
            other = other_prog = None
            if operator == "crossover":
                other, _ = select_parent(rng, grid, front, exclude=parent.id)
                other_prog = parse_program(other.source)
                parents.append(other.id)
            try:
                source, detail = mutate(operator, parent_prog, parent.constants, rng, other_prog,
                                        other.constants if other else None)
            except NotRepresentable as e:
                rejections.append({"operator": operator, "parents": parents, "rule": "not-representable", "reason": str(e)})
                return None
            detail += f", parent via {how}"
            call_idx = []
        try:
            child = parse_program(source)
            compile_program(child)
        except ProgramError as e:
            rejections.append({"operator": operator, "parents": parents, "rule": e.rule, "reason": str(e), "source": source})
            for ci in call_idx:
                llm_calls[ci]["outcome"] = "invalid_program"
            return None
        h = structure_hash(child)
        if h in self.structures and operator != "constants":
            rejections.append({"operator": operator, "parents": parents, "rule": "duplicate",
                               "reason": "same structure as a program already in the archive", "source": source})
            return None
        self.structures.add(h)
        return Candidate(child, parents, operator, detail, island, call_idx)

    def _prompt_rows(self, parent: ProgramRecord) -> list[dict]:
        rows = []
        for ev in self.archive.evaluations(parent.id):
            if ev["split"] not in ("train", "validate") or ev["n_requests"] == 0:
                continue
            o, p = ev["observed"], ev["predicted"]
            rows.append({"experiment": ev["experiment"], "split": ev["split"], "e2e_obs": o["e2e_mean_s"],
                         "e2e_err": _signed_error(p, o, "e2e_mean_s"), "ttft_obs": o["ttft_mean_s"],
                         "ttft_err": _signed_error(p, o, "ttft_mean_s")})
        return rows

    def _promotion_order(self, cands: list[Candidate], grid, front) -> list[Candidate]:
        """Children worth a full fit, most promising first: improvements on their cell's elite or
        on the front (by quick loss vs screening loss), then children opening an empty cell."""
        screens = [p.screen_loss for p in grid.values() if p.screen_loss is not None]
        best_screen = min(screens) if screens else math.inf
        improving, opening = [], []
        for c in cands:
            if not c.quick_loss < self.cfg.sanity_factor * best_screen:
                continue
            cell = cell_of(c.program.complexity, len(c.program.components_used))
            # to enter the grid it must beat its cell's elite; to enter the front, every simpler program
            front_refs = [p.screen_loss for p in front if p.complexity <= c.program.complexity and p.screen_loss is not None]
            refs = [min(front_refs)] if front_refs else []
            if cell in grid and grid[cell].screen_loss is not None:
                refs.append(grid[cell].screen_loss)
            if cell not in grid:
                opening.append((c.quick_loss, c))
            elif refs and c.quick_loss < max(refs) * (1 + self.cfg.promote_margin):
                improving.append((c.quick_loss / max(refs), c))
        ordered = [c for _, c in sorted(improving, key=lambda t: t[0])] + [c for _, c in sorted(opening, key=lambda t: t[0])]
        return ordered[: self.cfg.max_promotions]

    def _generation(self, g: int) -> None:
        t0 = time.perf_counter()
        island = g % self.cfg.islands
        pool = [p for p in self.programs if p.island == island]
        grid, front = elites(pool), pareto_front(pool)
        rejections: list[dict] = []
        llm_calls: list[dict] = []
        cands = [c for i in range(self.cfg.children) if (c := self._propose(g, i, grid, front, rejections, llm_calls))]
        for i, c in enumerate(cands):
            qcfg = dataclasses.replace(self.quick, seed=_mix(self.cfg.seed, g, i, 1) % (2**31))
            res = fit(c.program, self.exps, self.engine, qcfg, start=c.program.constants)
            self.evaluations += res.evaluations
            c.quick_loss, c.constants = res.loss, res.constants["all"]
        failed = [c for c in cands if not c.quick_loss < FAILED_LOSS]
        for c in failed:
            rejections.append({"operator": c.operator, "parents": c.parents, "rule": "evaluation",
                               "reason": FAILED_REASON,
                               "source": c.program.source})
            for ci in c.llm_call_indices:
                llm_calls[ci]["outcome"] = "evaluation_failed"
        cands = [c for c in cands if c not in failed]
        promoted = self._promotion_order(cands, grid, front)
        records = []
        for i, c in enumerate(cands):
            if c in promoted:
                full = self._full_evaluation(c.program, c.constants, _mix(self.cfg.seed, g, i, 2) % (2**31),
                                             self.cfg.full_fit_evals, self.cfg.full_fit_sigma)
                rec = self._record(c.program, full.pop("constants"), c.parents, c.operator, c.detail, c.island, "full",
                                   quick_loss=c.quick_loss, **full)
            else:
                rec = self._record(c.program, c.constants, c.parents, c.operator, c.detail, c.island, "screened",
                                   quick_loss=c.quick_loss)
            for ci in c.llm_call_indices:
                llm_calls[ci]["program_index"] = len(records)
            records.append(rec)
        if self.cfg.islands > 1 and g % self.cfg.migration_interval == 0:
            records.extend(self._migrants(g))
        self._commit(g, t0, records, rejections, llm_calls,
                     {"n_children": self.cfg.children, "n_promoted": len(promoted)})

    def _migrants(self, g: int) -> list[dict]:
        """Each island's best program, copied into the next island."""
        out = []
        n = self.cfg.islands
        for i in range(n):
            top = best([p for p in self.programs if p.island == i])
            if top is None:
                continue
            rec = {k: getattr(top, k) for k in ("source_hash", "source", "constants", "complexity", "n_components", "components",
                                                 "quick_loss", "screen_loss", "train_loss", "val_loss", "test_loss")}
            rec.update(parents=[top.id], operator="migration", operator_detail=f"island {i} -> {(i + 1) % n}",
                       island=(i + 1) % n, stage="full", evaluations=[
                           {"name": e["experiment"], "split": e["split"], "n_requests": e["n_requests"], "observed": e["observed"],
                            "predicted": e["predicted"], "ape": {"e2e": e["ape_e2e"], "ttft": e["ape_ttft"], "itl": e["ape_itl"]},
                            "timeouts": {"observed": e["timeouts_observed"], "predicted": e["timeouts_predicted"]}, **e["extra"]}
                           for e in self.archive.evaluations(top.id)])
            out.append(rec)
        return out

    # ---- the run ----
    def status(self, generation: int) -> dict:
        top = best(self.programs)
        elapsed = time.perf_counter() - self.started
        info = {"generation": generation, "programs": len(self.programs),
                "full": sum(p.full for p in self.programs), "best_train": top.train_loss if top else None,
                "best_val": top.val_loss if top else None, "rejections": dict(self.rejection_counts),
                "elapsed_s": elapsed}
        if self.llm is not None:
            info.update(llm_calls=self.llm.budget.calls, llm_tokens=self.llm.budget.tokens, llm_usd=self.llm.budget.usd)
        return info

    def run(self) -> dict:
        start = self.archive.last_generation(self.run_id) + 1
        done_evals = 0
        for g in range(start, self.cfg.generations + 1):
            t0 = time.perf_counter()
            if g == 0:
                self._generation_zero()
            else:
                self._generation(g)
            gens = self.archive.generations(self.run_id)
            done_evals = gens[-1]["evaluations"] if gens else 0
            info = self.status(g)
            info["evals_per_s"] = done_evals / max(time.perf_counter() - t0, 1e-9)
            self.progress(info)
        summary = self.summary()
        self.archive.set_summary(self.run_id, summary)
        return summary

    def summary(self) -> dict:
        top = best(self.programs)
        front = pareto_front(self.programs)
        out = {"generations": self.archive.last_generation(self.run_id), "programs": len(self.programs),
               "fully_evaluated": sum(p.full for p in self.programs), "rejections": dict(self.rejection_counts),
               "front": [{"id": p.id, "complexity": p.complexity, "val_loss": p.val_loss, "operator": p.operator} for p in front]}
        if top is not None:
            rows = [e for e in self.archive.evaluations(top.id) if e["split"] == "test"]
            out["best"] = {"id": top.id, "val_loss": top.val_loss, "train_loss": top.train_loss, "test_loss": top.test_loss,
                           "complexity": top.complexity, "operator": top.operator, "generation": top.generation,
                           "test": [{"name": e["experiment"], "n_requests": e["n_requests"], "ape": {
                               "e2e": e["ape_e2e"], "ttft": e["ape_ttft"], "itl": e["ape_itl"]}} for e in rows]}
        return out


__all__ = ["Search", "SearchConfig", "structure_hash", "OPERATORS"]
