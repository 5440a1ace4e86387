"""The LLM mutation operator: prompt with the parent, its errors and other programs; parse the
fenced code block; validate; retry a bounded number of times with the rejection fed back.
Two things stop it asking: the budget (`Budget`), and the circuit breaker (`Breaker`), which
opens after a few timeouts or connection failures in a row until the search closes it again."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources

import jinja2

from stepml_evolve.evaluator.dsl import ProgramError, check_units, compile_program, parse_program
from stepml_evolve.evaluator.hardware.components import COMPONENTS, dropped_time_components
from stepml_evolve.evaluator.physics.floor import Envelope
from stepml_evolve.evaluator.physics.rules import check_physics, inherit

from .llm_client import MAX_REPLY_CHARS, Attempt, LLMClient, LLMUnavailable
from .simplify import simplify

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(reply: str) -> str | None:
    """The fenced code block holding step_time (else the first fenced block), or None."""
    blocks = _FENCE.findall(reply or "")
    for b in blocks:
        if "def step_time" in b:
            return b
    return blocks[0] if blocks else None


def prompt_templates() -> jinja2.Environment:
    """The jinja2 environment over prompts/ (the system and mutation prompts)."""
    root = resources.files("stepml_evolve.prompts")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


@dataclass
class Budget:
    """Caps on the LLM side; None means no cap. Spent totals include replies served from the cache,
    so a replayed run stops at the same point as the original."""

    max_calls: int | None = None
    max_tokens: int | None = None
    max_usd: float | None = None
    calls: int = 0
    tokens: int = 0
    usd: float = 0.0

    def spend(self, a: Attempt) -> None:
        self.calls += 1
        self.tokens += a.prompt_tokens + a.completion_tokens
        self.usd += a.cost_usd

    def exhausted(self, pending: list[Attempt] = ()) -> str | None:
        """Why no further call may be made (None if one may), counting `pending` attempts not yet spent."""
        calls = self.calls + len(pending)
        tokens = self.tokens + sum(a.prompt_tokens + a.completion_tokens for a in pending)
        usd = self.usd + sum(a.cost_usd for a in pending)
        if self.max_calls is not None and calls >= self.max_calls:
            return f"LLM call cap reached ({calls} calls)"
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return f"LLM token cap reached ({tokens} tokens)"
        if self.max_usd is not None and usd >= self.max_usd:
            return f"LLM budget reached (${usd:.4f})"
        return None


UNREACHABLE = ("timeout", "connection_error")  # attempt outcomes that say the server is not answering
BREAKER_LIMIT = 3  # attempts in a row that may time out or fail to connect before the breaker opens


@dataclass
class Breaker:
    """A circuit breaker: open after `limit` attempts in a row that timed out or could not
    connect, retries included, so a hanging server costs `limit` timeouts, not every attempt of
    every LLM child; the search closes it at each generation (`reset`). It counts replayed
    attempts as live ones, so a resumed or replayed run opens it where the original did."""

    limit: int = BREAKER_LIMIT
    failures: int = 0  # attempts in a row that found no server

    def count(self, attempts: list[Attempt]) -> None:
        self.failures = self._after(attempts)

    def is_open(self, pending: list[Attempt] = ()) -> bool:
        """Whether no further attempt may be made, counting `pending` attempts not yet counted."""
        return self._after(pending) >= self.limit

    def _after(self, attempts) -> int:
        n = self.failures
        for a in attempts:
            n = n + 1 if a.outcome in UNREACHABLE else 0
        return n

    def reset(self) -> None:
        self.failures = 0

    def why(self) -> str:
        return f"{self.limit} LLM attempts in a row timed out or could not connect"


@dataclass
class LLMProposal:
    source: str | None
    attempts: list[Attempt] = field(default_factory=list)
    reason: str = ""  # why no valid program came back
    rule: str = ""


class LLMOperator:
    def __init__(
        self,
        client: LLMClient,
        budget: Budget,
        max_attempts: int = 3,
        server: dict | None = None,
        units: bool = True,
        keep_time_components: bool = False,
        envelope: Envelope | None = None,
    ):
        """units: a reply whose functions do not return times is a rejection fed back for a retry
        (as the search would reject it; `evolve run --units check`); keep_time_components: so is a
        reply that drops a time component of its parent (`--time-components keep`), and the system
        prompt says so; envelope (`--physics check`): so is a reply that, with its parent's bounds
        and priors on the constants it keeps, breaks the physics of evaluator/physics/rules.py on it."""
        self.client, self.budget, self.max_attempts, self.units = client, budget, max_attempts, units
        self.keep_time_components = keep_time_components
        self.envelope = envelope
        self.breaker = Breaker()
        env = prompt_templates()
        self.system = env.get_template("system.j2").render(
            components=COMPONENTS,
            budget_tokens=(server or {}).get("budget_tokens", 2048),
            max_seqs=(server or {}).get("max_seqs", 128),
            keep_time_components=keep_time_components,
            physics=envelope is not None,
        )
        self.mutate_t = env.get_template("mutate.j2")
        self.retry_t = env.get_template("retry.j2")

    def propose(
        self, parent, parent_rows: list[dict], examples: list, request_tag: str = "", residual_summary: str = ""
    ) -> LLMProposal:
        """Ask for a child of `parent`; request_tag (e.g. generation.child) makes each request distinct,
        so the reply cache never hands the same answer to two different children. residual_summary:
        where, inside the experiments, the parent's error grows (evaluator/discovery/explain.py)."""
        messages = [
            {"role": "system", "content": self.system},
            {
                "role": "user",
                "content": self.mutate_t.render(
                    parent=parent,
                    parent_rows=parent_rows,
                    examples=examples,
                    request_tag=request_tag,
                    residual_summary=residual_summary,
                ),
            },
        ]
        proposal = LLMProposal(None)
        for _ in range(self.max_attempts):
            if why := self.budget.exhausted():
                proposal.reason, proposal.rule = why, "llm-budget"
                return proposal
            if self.breaker.is_open():
                proposal.reason, proposal.rule = self.breaker.why(), "llm-breaker"
                return proposal
            try:
                reply = self.client.complete(messages, may_retry=self._may_retry)
            except LLMUnavailable as e:
                self._count(e.attempts)
                proposal.attempts.extend(e.attempts)
                proposal.reason, proposal.rule = f"LLM call failed: {e}", "llm-" + e.attempts[-1].outcome
                if self.breaker.is_open():
                    proposal.reason, proposal.rule = f"{proposal.reason}; {self.breaker.why()}", "llm-breaker"
                return proposal
            self._count(reply.attempts)
            proposal.attempts.extend(reply.attempts)
            last = reply.attempts[-1]
            if reply.received_chars:
                last.outcome, reason = (
                    "too_large",
                    (
                        f"the reply has {reply.received_chars} characters, more than the {MAX_REPLY_CHARS} a reply "
                        "may have; only its beginning is kept"
                    ),
                )
                last.error = reason
                proposal.rule = "llm-size"
            elif (code := extract_code(reply.content)) is None:
                last.outcome, reason = "no_code", "the reply has no fenced ```python code block"
                proposal.rule = "llm-no-code"
            else:
                try:
                    program = parse_program(code)
                    compile_program(program)
                    if self.units:
                        check_units(program)
                    if self.keep_time_components:
                        self._check_keeps(parent, program)
                    if self.envelope is not None:
                        check_physics(
                            simplify(inherit(program, parse_program(parent.source), self.envelope))[0], self.envelope
                        )
                    last.outcome = "valid"
                    proposal.source, proposal.reason, proposal.rule = code, "", ""
                    return proposal
                except ProgramError as e:
                    last.outcome, reason = "invalid_program", str(e)
                    last.error = reason
                    proposal.rule = f"llm-{e.rule}"
            proposal.reason = reason
            messages = messages + [  # the reply as kept: capped, so a retry prompt stays bounded
                {"role": "assistant", "content": reply.content},
                {"role": "user", "content": self.retry_t.render(reason=reason)},
            ]
        return proposal

    @staticmethod
    def _check_keeps(parent, program) -> None:
        if dropped := dropped_time_components(parent.components, program.components_used):
            names = ", ".join("f." + c for c in dropped)
            raise ProgramError(
                None,
                "time-components",
                f"drops {names}, which the parent uses; keep every time component of the parent "
                "(scale it, gate it or add to it, but keep it)",
            )

    def _may_retry(self, pending: list[Attempt]) -> bool:
        return self.budget.exhausted(pending) is None and not self.breaker.is_open(pending)

    def _count(self, attempts: list[Attempt]) -> None:
        for a in attempts:
            self.budget.spend(a)
        self.breaker.count(attempts)
