"""The workloads a world's configurations serve: who sends what, and how hard.

A workload draws each request's prompt and output length; its arrival rate is a share
(`utilization`) of the configuration's saturated throughput under the world's law, measured by a
pilot replay, so every configuration is loaded alike whatever its speed. The overloaded workload
is offered more than the server can do and its client gives up (a failed request, as in the real
data's overloaded runs); prompt-reuse resends a list of prompts that share system prompts, so
the prefix cache serves most of each (the real runs' load generator).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..synthetic import cycled_prompts


@dataclass(frozen=True)
class Requests:
    inputs: np.ndarray
    outputs: np.ndarray
    prefix_group: np.ndarray | None = None  # shared system prompt of each request (-1: none)
    prompt: np.ndarray | None = None  # equal ids: identical prompts
    prefix_tokens: int = 0
    profile_data: dict | None = None  # profile.json's "data"


@dataclass(frozen=True)
class Workload:
    name: str
    utilization: float  # arrival rate / saturated throughput
    timeout_s: float  # the client's limit
    description: str
    # overloaded: the client gives up after the time the saturated server takes to serve this share
    # of the requests (so a share of them times out whatever the configuration's speed)
    timeout_backlog: float | None = None

    def timeout(self, n: int, throughput: float) -> float:
        """The client's limit (s) for n requests on a server of this saturated throughput (requests/s)."""
        if self.timeout_backlog is None:
            return self.timeout_s
        return max(MIN_TIMEOUT_S, round(self.timeout_backlog * n / throughput, 1))

    def requests(self, rng: np.random.Generator, n: int, n_prompts: int) -> Requests:
        return _DRAW[self.name](rng, n, n_prompts)


def _uniform(rng, n, lo, hi):
    return rng.integers(lo, hi + 1, size=n).astype(np.int64)


def _lognormal(rng, n, median, sigma, lo, hi):
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, size=n)), lo, hi).astype(np.int64)


def _random(inputs, outputs) -> Requests:
    return Requests(inputs, outputs, profile_data={"type": "random"})


MIN_TIMEOUT_S = 5.0
SYSTEM_PROMPT, QUESTION, REUSE_OUTPUT, REUSE_GROUPS = 1200, 250, 150, 8


def _mixed(rng, n, _) -> Requests:
    return _random(_lognormal(rng, n, 500, 0.9, 16, 3000), _lognormal(rng, n, 180, 0.9, 4, 1000))


def _prompt_reuse(rng, n, n_prompts) -> Requests:
    prompt, inputs, group = cycled_prompts(rng, n, SYSTEM_PROMPT, QUESTION, REUSE_GROUPS, n_prompts)
    data = {
        "type": "shared_prefix",
        "shared_prefix": {
            "num_unique_system_prompts": REUSE_GROUPS,
            "system_prompt_len": SYSTEM_PROMPT,
            "question_len": QUESTION,
            "output_len": REUSE_OUTPUT,
        },
    }
    return Requests(inputs, np.full(n, REUSE_OUTPUT, np.int64), group, prompt, SYSTEM_PROMPT, data)


_DRAW = {
    "prefill-heavy": lambda rng, n, _: _random(_uniform(rng, n, 1200, 2800), _uniform(rng, n, 16, 96)),
    "decode-heavy": lambda rng, n, _: _random(_uniform(rng, n, 64, 320), _uniform(rng, n, 400, 1200)),
    "mixed": _mixed,
    "prompt-reuse": _prompt_reuse,
    "overloaded": _mixed,  # the mixed requests, offered faster than they are served
}

WORKLOADS = {
    w.name: w
    for w in (
        Workload("mixed", 0.55, 300.0, "prompts and outputs log-normal (medians 500 and 180 tokens)"),
        Workload("prefill-heavy", 0.6, 300.0, "long prompts (1200-2800 tokens), short outputs (16-96)"),
        Workload("decode-heavy", 0.6, 300.0, "short prompts (64-320 tokens), long outputs (400-1200)"),
        Workload("prompt-reuse", 0.6, 300.0, "a cycled prompt list over 8 shared 1200-token system prompts"),
        Workload(
            "overloaded",
            2.0,
            300.0,
            "mixed, offered twice the throughput; the client gives up after the time a third of the requests take",
            timeout_backlog=1 / 3,
        ),
    )
}
