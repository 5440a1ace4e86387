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

from stepml_evolve.evaluator.known_truth.synthetic_sample import cycled_prompts


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
# a second resent list, as the real runs' workloads differ: shorter prompts, longer fixed outputs
LONG_SYSTEM_PROMPT, LONG_QUESTION, LONG_REUSE_OUTPUT, LONG_REUSE_GROUPS = 700, 150, 500, 4
# the deployments nobody measured (issue 52's four real runs): long prompts computed, not served from
# a cache (or only a shared prefix of them), and outputs of every length
LONG_PROMPT = (1700, 4200)
SHARED_PREFIX = 1024
VARIED_OUTPUT = (200, 0.8, 16, 1500)  # log-normal median, sigma, clipped to [min, max]


def _mixed(rng, n, _) -> Requests:
    return _random(_lognormal(rng, n, 500, 0.9, 16, 3000), _lognormal(rng, n, 180, 0.9, 4, 1000))


def _shared_prefix_data(groups: int, system: int, question: int, output: int | None) -> dict:
    """profile.json's "data" of inference-perf's shared-prefix generator (output None: outputs of
    every length, so the profile states none and the loader reads each request's)."""
    shared = {"num_unique_system_prompts": groups, "system_prompt_len": system, "question_len": question}
    return {"type": "shared_prefix", "shared_prefix": shared | ({} if output is None else {"output_len": output})}


def _reuse(rng, n, n_prompts, system: int, question: int, output: int, groups: int) -> Requests:
    """A resent list of prompts over shared system prompts, every output `output` tokens long."""
    prompt, inputs, group = cycled_prompts(rng, n, system, question, groups, n_prompts)
    data = _shared_prefix_data(groups, system, question, output)
    return Requests(inputs, np.full(n, output, np.int64), group, prompt, system, data)


def _prompt_reuse(rng, n, n_prompts) -> Requests:
    return _reuse(rng, n, n_prompts, SYSTEM_PROMPT, QUESTION, REUSE_OUTPUT, REUSE_GROUPS)


def _prompt_reuse_long(rng, n, n_prompts) -> Requests:
    return _reuse(rng, n, n_prompts, LONG_SYSTEM_PROMPT, LONG_QUESTION, LONG_REUSE_OUTPUT, LONG_REUSE_GROUPS)


def _varied_outputs(rng, n) -> np.ndarray:
    return _lognormal(rng, n, *VARIED_OUTPUT)


def _long_uncached(rng, n, _) -> Requests:
    return _random(_uniform(rng, n, *LONG_PROMPT), _varied_outputs(rng, n))


def _long_shared_prefix(rng, n, _) -> Requests:
    """Long prompts behind one shared prefix: the prefix is cached, each question computed."""
    inputs = SHARED_PREFIX + _uniform(rng, n, LONG_PROMPT[0] - SHARED_PREFIX, LONG_PROMPT[1] - SHARED_PREFIX)
    question = int(np.median(inputs)) - SHARED_PREFIX
    data = _shared_prefix_data(1, SHARED_PREFIX, question, None)
    return Requests(inputs, _varied_outputs(rng, n), np.zeros(n, np.int64), None, SHARED_PREFIX, data)


_DRAW = {
    "prefill-heavy": lambda rng, n, _: _random(_uniform(rng, n, 1200, 2800), _uniform(rng, n, 16, 96)),
    "decode-heavy": lambda rng, n, _: _random(_uniform(rng, n, 64, 320), _uniform(rng, n, 400, 1200)),
    "mixed": _mixed,
    "prompt-reuse": _prompt_reuse,
    "overloaded": _mixed,  # the mixed requests, offered faster than they are served
    "prompt-reuse-long": _prompt_reuse_long,
    "long-uncached": _long_uncached,
    "long-shared-prefix": _long_shared_prefix,
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
        # the workload shift (grid "workloads", split by-workload): trained on the two resent lists,
        # held out on long prompts computed in full or behind one shared prefix, outputs of every length
        Workload(
            "prompt-reuse-long",
            0.6,
            300.0,
            "a cycled prompt list over 4 shared 700-token system prompts, every output 500 tokens",
        ),
        Workload("long-uncached", 0.6, 300.0, "long prompts (1700-4200 tokens) computed in full, outputs log-normal"),
        Workload(
            "long-shared-prefix",
            0.6,
            300.0,
            "long prompts (1700-4200 tokens) behind one shared 1024-token prefix, outputs log-normal",
        ),
    )
}
# the workloads the standard grid rotates through (the others belong to the workload grid)
STANDARD_WORKLOADS = ("mixed", "prefill-heavy", "decode-heavy", "prompt-reuse", "overloaded")
