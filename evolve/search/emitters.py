"""Emitters propose children; the search loop evaluates them (pyribs' ask/tell, for programs).

An emitter owns its state (an LLM's budget, its calls, its circuit breaker), is told when a
generation begins (`begin`), and answers two questions:
  * `ask(ctx)`: a child of the parent the loop chose, as program text, or why there is none
    (a rejection record); with the LLM calls it made, if any;
  * `tell(proposal, outcome, program_index)`: what became of it (invalid, duplicate, failed
    evaluation, archived), so the emitter can keep its own records straight.
The loop never looks inside an emitter: adding one (a new symbolic move, another engine) is a
new class here and one line where the emitters are built (`build_emitters`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from stepml_evolve.archive.map_elites import Elites
from stepml_evolve.archive.records import LLMCallRecord, ProgramRecord, RejectionRecord
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.dsl import Program, parse_program

from .llm_operator import LLMOperator
from .residual_terms import OPERATOR as RESIDUAL_TERM
from .residual_terms import ResidualSource, next_child, seed_of
from .selection import examples_for, select_parent
from .structure import structure_hash
from .symbolic import NotRepresentable, mutate

OPERATOR_WEIGHTS = {
    "subtree": 0.2,
    "node_replace": 0.15,
    "insert": 0.1,
    "shrink": 0.1,
    "crossover": 0.15,
    "constants": 0.1,
    "add_term": 0.2,
}


def operator_weights(modulate: float = 0.0, switch: float = 0.0) -> dict[str, float]:
    """The symbolic operators' weights with the opt-in `modulate` and `switch` taking those shares
    of the children (0: not drawn, so the operators and draws of the runs before they existed)."""
    opt_in = {name: share for name, share in (("modulate", modulate), ("switch", switch)) if share > 0.0}
    if not opt_in:
        return dict(OPERATOR_WEIGHTS)
    rest = 1.0 - sum(opt_in.values())
    return {**{k: w * rest for k, w in OPERATOR_WEIGHTS.items()}, **opt_in}


# Outcomes the loop tells an emitter about a proposal with a source.
INVALID, DUPLICATE, EVALUATION_FAILED, ARCHIVED = "invalid_program", "duplicate", "evaluation_failed", "archived"


@dataclass
class AskContext:
    """What an emitter may look at to propose child `child` of `generation`."""

    generation: int
    child: int
    rng: random.Random  # this child's stream: derived from (seed, generation, child)
    parent: ProgramRecord
    parent_program: Program
    how: str  # how the parent was chosen: elite, front or cell
    elites: Elites
    archive: Archive


@dataclass
class Proposal:
    operator: str
    parents: list[int]
    source: str | None = None  # None: no child (see `rejection`)
    detail: str = ""
    rejection: RejectionRecord | None = None
    llm_calls: list[LLMCallRecord] = field(default_factory=list)
    reuses_structure: bool = False  # a new constant set for an archived structure (exempt from the duplicate filter)
    notice: str = ""  # a line for the user (e.g. the LLM's circuit breaker opened)


class Emitter(Protocol):
    share: float  # share of children asked of this emitter (the first emitter gets the rest)

    def available(self) -> bool: ...

    def resume(self, archive: Archive, run_id: int) -> None: ...

    def begin(self, generation: int) -> None: ...  # a generation starts: per-generation state is reset

    def ask(self, ctx: AskContext) -> Proposal: ...

    def tell(self, proposal: Proposal, outcome: str, program_index: int | None = None) -> None: ...

    def status(self) -> dict: ...  # figures for the live progress line


class SymbolicEmitter:
    """DEAP GP operators on the parent's expression tree (see symbolic.py); no state."""

    share = 1.0

    def __init__(self, modulate: float = 0.0, switch: float = 0.0, causal: bool = False):
        self.weights = operator_weights(modulate, switch)
        self.causal = causal  # draw no input a causal search refuses (symbolic.NOT_DRAWN_CAUSAL)

    def available(self) -> bool:
        return True

    def resume(self, archive: Archive, run_id: int) -> None:
        pass

    def begin(self, generation: int) -> None:
        pass

    def ask(self, ctx: AskContext) -> Proposal:
        rng = ctx.rng
        operator = rng.choices(list(self.weights), weights=list(self.weights.values()))[0]
        parents = [ctx.parent.id]
        other = other_prog = None
        if operator == "crossover":
            other, _ = select_parent(rng, ctx.elites.grid, ctx.elites.front, exclude=ctx.parent.id)
            other_prog = parse_program(other.source)
            parents.append(other.id)
        try:
            source, detail = mutate(
                operator,
                ctx.parent_program,
                ctx.parent.constants,
                rng,
                other_prog,
                other.constants if other else None,
                causal=self.causal,
            )
        except NotRepresentable as e:
            return Proposal(
                operator,
                parents,
                rejection=RejectionRecord(operator=operator, parents=parents, rule="not-representable", reason=str(e)),
            )
        return Proposal(
            operator, parents, source, f"{detail}, parent via {ctx.how}", reuses_structure=operator == "constants"
        )

    def tell(self, proposal: Proposal, outcome: str, program_index: int | None = None) -> None:
        pass

    def status(self) -> dict:
        return {}


class LLMEmitter:
    """Asks an LLM (through LLMOperator: prompt, fenced-code parsing, retries) for a child; owns
    the budget, rebuilt from the archive's call records on resume, and the circuit breaker: once
    it opens, the LLM is not asked again in that generation (its other children are symbolic)."""

    def __init__(self, operator: LLMOperator, share: float, residuals=None):
        self.operator, self.share = operator, share
        self.residuals = residuals  # a ResidualSource: the prompt's residual summary (None: none)

    @property
    def name(self) -> str:
        return f"llm:{self.operator.client.model}"

    def available(self) -> bool:
        return self.operator.budget.exhausted() is None and not self.operator.breaker.is_open()

    def begin(self, generation: int) -> None:
        self.operator.breaker.reset()

    def resume(self, archive: Archive, run_id: int) -> None:
        budget = self.operator.budget
        for c in archive.llm_calls(run_id):
            budget.calls += 1
            budget.tokens += c.prompt_tokens + c.completion_tokens
            budget.usd += c.cost_usd

    def ask(self, ctx: AskContext) -> Proposal:
        parents = [ctx.parent.id]
        summary = ""
        if self.residuals is not None:
            summary = self.residuals.summary(ctx.parent.id, ctx.parent_program, dict(ctx.parent.constants))
        result = self.operator.propose(
            ctx.parent,
            prompt_rows(ctx.archive, ctx.parent),
            examples_for(ctx.parent, ctx.elites.grid, ctx.rng),
            request_tag=f"{ctx.generation}.{ctx.child}",
            residual_summary=summary,
        )
        calls = [LLMCallRecord(**a.record()) for a in result.attempts]
        if result.source is None:
            notice = ""
            if result.rule == "llm-breaker":  # recorded in the archive as this rejection's rule
                notice = (
                    f"generation {ctx.generation}: {self.operator.breaker.why()}; the LLM is not asked again "
                    "in this generation (its other children are symbolic)"
                )
            return Proposal(
                self.name,
                parents,
                rejection=RejectionRecord(operator=self.name, parents=parents, rule=result.rule, reason=result.reason),
                llm_calls=calls,
                notice=notice,
            )
        return Proposal(
            self.name, parents, result.source, f"{len(result.attempts)} call(s), parent via {ctx.how}", llm_calls=calls
        )

    def tell(self, proposal: Proposal, outcome: str, program_index: int | None = None) -> None:
        """The call that produced the program records its fate: invalid, failed, or which program it became."""
        if not proposal.llm_calls:
            return
        last = proposal.llm_calls[-1]
        if outcome in (INVALID, EVALUATION_FAILED):
            last.outcome = outcome
        elif outcome == ARCHIVED:
            last.program_index = program_index

    def status(self) -> dict:
        b = self.operator.budget
        return {"llm_calls": b.calls, "llm_tokens": b.tokens, "llm_usd": b.usd}


class ResidualEmitter:
    """Proposes `residual_term` children (residual_terms.py) for its share of a generation's children:
    each parent's residuals and screening computed once a run; the structures it proposed rebuilt
    from the archive on resume, so a resumed run proposes what an uninterrupted one would."""

    def __init__(self, source: ResidualSource, share: float):
        self.source, self.share = source, share
        self.tried: set[str] = set()  # structures it proposed

    def available(self) -> bool:
        return True

    def resume(self, archive: Archive, run_id: int) -> None:
        sources = [p.source for p in archive.programs(run_id) if p.operator == RESIDUAL_TERM]
        sources += [r.source for r in archive.rejections(run_id) if r.operator == RESIDUAL_TERM and r.source]
        self.tried |= {structure_hash(parse_program(text)) for text in sources}

    def begin(self, generation: int) -> None:
        pass

    def ask(self, ctx: AskContext) -> Proposal:
        parents = [ctx.parent.id]
        constants = dict(ctx.parent.constants) or dict(ctx.parent_program.constants)
        seed = seed_of(ctx.parent, ctx.archive.program)
        child = next_child(self.source, ctx.parent.id, ctx.parent_program, constants, self.tried, seed)
        if isinstance(child, str):
            rule, why = child.split(": ", 1)
            rejection = RejectionRecord(operator=RESIDUAL_TERM, parents=parents, rule=rule, reason=why)
            return Proposal(RESIDUAL_TERM, parents, rejection=rejection)
        text, detail = child
        return Proposal(RESIDUAL_TERM, parents, text, f"{RESIDUAL_TERM}: + {detail}, parent via {ctx.how}")

    def tell(self, proposal: Proposal, outcome: str, program_index: int | None = None) -> None:
        pass

    def status(self) -> dict:
        return {}


def prompt_rows(archive: Archive, parent: ProgramRecord) -> list[dict]:
    """The parent's signed errors per experiment on train and validate, for the LLM prompt."""
    return signed_errors(archive.metric_rows(parent.id), ("train", "validate"))


def signed_errors(metric_rows: list, splits: tuple[str, ...]) -> list[dict]:
    """Per experiment and split (of `splits`): observed mean E2E and TTFT and the signed errors in percent."""
    rows = []
    for r in metric_rows:
        if r.split not in splits or r.n_requests == 0:
            continue
        o, p = r.observed, r.predicted
        rows.append(
            {
                "experiment": r.name,
                "split": r.split,
                "e2e_obs": o.e2e_mean_s,
                "e2e_err": _signed_error(p.e2e_mean_s, o.e2e_mean_s),
                "ttft_obs": o.ttft_mean_s,
                "ttft_err": _signed_error(p.ttft_mean_s, o.ttft_mean_s),
            }
        )
    return rows


def _signed_error(predicted: float | None, observed: float | None) -> float:
    """(predicted - observed) / observed in percent, NaN where undefined."""
    return (predicted - observed) / observed * 100 if observed and predicted is not None else math.nan


def build_emitters(
    llm: LLMOperator | None = None,
    llm_share: float = 0.0,
    modulate: float = 0.0,
    switch: float = 0.0,
    causal: bool = False,
    residual: float = 0.0,
    source=None,
) -> list[Emitter]:
    """The emitters of a run: symbolic operators by default, plus the LLM for its share of children
    and `residual_term` for its share (residual_terms.py; `source`: the run's ResidualSource)."""
    emitters: list[Emitter] = [SymbolicEmitter(modulate, switch, causal)]
    if llm is not None:
        emitters.append(LLMEmitter(llm, llm_share, source))
    if residual > 0 and source is not None:
        emitters.append(ResidualEmitter(source, residual))
    return emitters
