"""The LLM mutation operator: prompt with the parent, its errors and other programs; parse the
fenced code block; validate; retry a bounded number of times with the rejection fed back."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources

import jinja2

from stepml_evolve.evaluator.components import COMPONENTS
from stepml_evolve.evaluator.dsl import ProgramError, check_units, compile_program, parse_program

from .llm_client import Attempt, LLMClient, LLMUnavailable

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


@dataclass
class LLMProposal:
    source: str | None
    attempts: list[Attempt] = field(default_factory=list)
    reason: str = ""  # why no valid program came back
    rule: str = ""


class LLMOperator:
    def __init__(
        self, client: LLMClient, budget: Budget, max_attempts: int = 3, server: dict | None = None, units: bool = True
    ):
        """units: a reply whose functions do not return times is a rejection fed back for a retry
        (as the search would reject it; `evolve run --units check`)."""
        self.client, self.budget, self.max_attempts, self.units = client, budget, max_attempts, units
        env = prompt_templates()
        self.system = env.get_template("system.j2").render(
            components=COMPONENTS,
            budget_tokens=(server or {}).get("budget_tokens", 2048),
            max_seqs=(server or {}).get("max_seqs", 128),
        )
        self.mutate_t = env.get_template("mutate.j2")
        self.retry_t = env.get_template("retry.j2")

    def propose(self, parent, parent_rows: list[dict], examples: list, request_tag: str = "") -> LLMProposal:
        """Ask for a child of `parent`; request_tag (e.g. generation.child) makes each request distinct,
        so the reply cache never hands the same answer to two different children."""
        messages = [
            {"role": "system", "content": self.system},
            {
                "role": "user",
                "content": self.mutate_t.render(
                    parent=parent, parent_rows=parent_rows, examples=examples, request_tag=request_tag
                ),
            },
        ]
        proposal = LLMProposal(None)
        for _ in range(self.max_attempts):
            if why := self.budget.exhausted():
                proposal.reason, proposal.rule = why, "llm-budget"
                return proposal
            try:
                reply = self.client.complete(messages, may_retry=lambda pending: self.budget.exhausted(pending) is None)
            except LLMUnavailable as e:
                for a in e.attempts:
                    self.budget.spend(a)
                proposal.attempts.extend(e.attempts)
                proposal.reason, proposal.rule = f"LLM call failed: {e}", "llm-" + e.attempts[-1].outcome
                return proposal
            for a in reply.attempts:
                self.budget.spend(a)
            proposal.attempts.extend(reply.attempts)
            last = reply.attempts[-1]
            code = extract_code(reply.content)
            if code is None:
                last.outcome, reason = "no_code", "the reply has no fenced ```python code block"
                proposal.rule = "llm-no-code"
            else:
                try:
                    program = parse_program(code)
                    compile_program(program)
                    if self.units:
                        check_units(program)
                    last.outcome = "valid"
                    proposal.source, proposal.reason, proposal.rule = code, "", ""
                    return proposal
                except ProgramError as e:
                    last.outcome, reason = "invalid_program", str(e)
                    last.error = reason
                    proposal.rule = f"llm-{e.rule}"
            proposal.reason = reason
            messages = messages + [
                {"role": "assistant", "content": reply.content},
                {"role": "user", "content": self.retry_t.render(reason=reason)},
            ]
        return proposal
