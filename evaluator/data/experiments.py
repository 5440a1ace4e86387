"""Replay experiments: what one holds, the data caveats, the bounds on what is read, and the temporal split.

Format: ../shared/data/README.md. One directory per experiment with requests.json,
ground_truth.json and (optional) profile.json / summary_lifecycle_metrics.json. Caveats
handled here, each with a policy in `LoadOptions`:
  * output length: the server ran with ignore_eos, so every successful request generated the
    profile's output_len; the client's re-tokenized `output_tokens` is unreliable.
  * failed requests are client timeouts: kept in the replay (they occupy seats and KV until
    the client gives up at their observed E2E) but excluded from error metrics. Their
    recorded input_tokens is 0, so the input length is imputed from successful requests.
  * prompt reuse (prefix caching): which earlier requests sent the same prompt tokens, so that
    the replay's KV cache serves their full blocks; decided per `LoadOptions.prompt_reuse`
    policy in prompt_reuse.py (detect a cycled prompt list, share only system prompts, or
    nothing). Data that record per-request groups (a non-empty `prefix_group` with its
    `prefix_length`, else the profile's system_prompt_len; e.g. imported from a BLIS trace) are
    replayed with their own groups, each of its own length.
  * measurement point (`requests.json` key `measurement`, default client): "client" when arrival,
    TTFT and E2E were taken at the client from the send time, "server" when taken at the server
    from its arrival (an OTel span start). Either way the replay injects a request at its
    arrival_time_us, the moment its TTFT and E2E are measured from.
  * temporal split by arrival time, default 60/20/20.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from stepml_evolve.evaluator.data.prompt_reuse import (
    DEFAULT_POLICY,
    POLICIES,
    ReuseReport,
    Sharing,
    trace_sharing,
)
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.hardware.hardware import DEFAULT_HARDWARE, Hardware, get_hardware
from stepml_evolve.evaluator.hardware.model_arch import ModelArch

SPLITS = ("train", "validate", "test")
ALL = "all"  # every request of an experiment (held-out experiments in cross-validation are scored on it)
SCORED_SPLITS = SPLITS + (ALL,)  # what a split argument may name
MEASUREMENTS = ("client", "server")
DEFAULT_CLIENT_TIMEOUT_S = 300.0  # inference-perf's request timeout in the real data

# Bounds on what the replay allocates or counts (README "Bad input"), each far above any real
# deployment: a typo or a hostile file is refused by file and field, never a MemoryError mid-replay.
MAX_TOKENS = 10_000_000  # tokens of one request (input, output, a shared prefix) or of one step
MAX_REQUESTS = 10_000_000  # requests of one experiment (and prompt groups)
MAX_TP = 64
MAX_SEQS = 1_000_000  # max_num_seqs
MAX_KV_BLOCKS = 10_000_000  # kv_blocks_total_gpu: 300 times the largest real cache
MAX_BLOCK_SIZE = 65_536
MAX_BLOCK_SLOTS = 100_000_000  # the replay's block lists: sum over requests of (input + output) / block_size
MAX_TIME_US = 10**15  # an arrival (us) or a latency (1e9 s); the replay caps a duration here too
MAX_TIME_S = MAX_TIME_US // 10**6


class ExperimentError(UserError):
    """A bad experiment: str() is one line naming the experiment and the problem."""

    def __init__(self, experiment: str, problem: str):
        self.experiment = experiment
        self.problem = problem
        super().__init__(f"{experiment}: {problem}")


@dataclass(frozen=True)
class LoadOptions:
    output_len: str = "profile"  # "profile" (server output_len, ignore_eos) or "reported"
    split: tuple[float, float] = (0.6, 0.2)  # train and validate fractions; test is the rest
    hardware: str | None = None  # override; otherwise the experiment's own, else H100
    client_timeout_s: float | None = None  # None: from the failed requests, else 300 s
    prompt_reuse: str = DEFAULT_POLICY  # detect | system-prompt | off (prompt_reuse.py)

    def __post_init__(self):
        if self.output_len not in ("profile", "reported"):
            raise ValueError(f"output_len policy must be 'profile' or 'reported', not {self.output_len!r}")
        if self.prompt_reuse not in POLICIES:
            raise ValueError(f"prompt reuse policy must be one of {', '.join(POLICIES)}, not {self.prompt_reuse!r}")
        tr, va = self.split
        if not (0 < tr < 1 and 0 <= va < 1 and tr + va <= 1):
            raise ValueError(f"bad split fractions {self.split}")


@dataclass
class ServerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: int
    block_size: int


@dataclass
class Experiment:
    """One experiment, requests in arrival order. Times: arrival in us, observations in s."""

    name: str
    model: str  # model id, e.g. meta-llama/Llama-2-7b-hf
    workload: str
    tp: int
    hardware: Hardware
    arch: ModelArch
    server: ServerConfig
    arrival_us: np.ndarray  # int64
    input_tokens: np.ndarray  # int64, imputed for failed requests
    output_tokens: np.ndarray  # int64, the length the replay generates (policy applied)
    reported_output_tokens: np.ndarray  # int64, as the client recorded it
    failed: np.ndarray  # bool, observed client timeout
    abort_after_us: np.ndarray  # int64, client gives up this long after arrival
    e2e_s: np.ndarray  # observed, float64
    ttft_s: np.ndarray  # observed, NaN for failed requests
    split: np.ndarray  # int8: 0 train, 1 validate, 2 test (temporal)
    source_split: str = ""  # experiment-level split of the source repository
    output_len_used: int | None = None  # profile output_len when that policy applied
    n_imputed_inputs: int = 0
    summary: dict | None = None  # inference-perf's own means, for cross-checks
    synthetic: bool = False
    notes: list[str] = field(default_factory=list)
    # Prompt reuse (prompt_reuse.py): requests with equal prompt[i] sent identical prompts; request i
    # starts with the shared prefix of group prefix_group[i] (-1: none), group_tokens[g] tokens long.
    prefix_group: np.ndarray | None = None  # int64
    group_tokens: tuple[int, ...] = ()
    prompt: np.ndarray | None = None  # int64; None: every request its own prompt
    recorded_groups: bool = False  # prefix_group came from the data, not from the loader's policy
    measurement: str = "client"  # where arrival/TTFT/E2E were measured: client (send time) or server
    prompt_reuse: ReuseReport | None = None  # what the loader decided (None: built in memory)

    def __post_init__(self):
        n = len(self.arrival_us)
        if self.prefix_group is None:
            self.prefix_group = np.full(n, -1, dtype=np.int64)
        if self.prompt is None:
            self.prompt = np.arange(n, dtype=np.int64)

    @property
    def sharing(self) -> Sharing:
        return Sharing(self.prompt, self.prefix_group, self.group_tokens)

    @property
    def n_requests(self) -> int:
        return len(self.arrival_us)

    @property
    def n_failed(self) -> int:
        return int(self.failed.sum())

    @property
    def replay_cost(self) -> int:
        """What its replay's time grows with, to start the longest first: the tokens it decodes."""
        return int(self.output_tokens.sum())

    @classmethod
    def from_arrays(
        cls,
        name: str,
        arrival_us,
        input_tokens,
        output_tokens,
        *,
        arch: ModelArch,
        tp: int = 1,
        hardware: str = DEFAULT_HARDWARE,
        max_num_seqs: int = 128,
        max_num_batched_tokens: int = 2048,
        kv_blocks: int = 10_000,
        block_size: int = 16,
        prefix_group=None,
        prefix_tokens: int = 0,
        group_tokens=None,
        prompt=None,
        timeout_s: float = 300.0,
        model: str = "in-memory",
        split=(0.6, 0.2),
    ) -> Experiment:
        """An in-memory experiment without ground truth (observations are NaN), for generators and tests.
        prefix_group[i] >= 0: request i starts with that group's shared prefix, group_tokens[g] long
        (or prefix_tokens for every group); prompt[i]: requests with equal ids sent identical prompts."""
        arrival = np.asarray(arrival_us, dtype=np.int64)
        n = len(arrival)
        out = np.asarray(output_tokens, dtype=np.int64)
        inputs = np.asarray(input_tokens, dtype=np.int64)
        groups = np.full(n, -1, np.int64) if prefix_group is None else np.asarray(prefix_group, dtype=np.int64)
        prompts = np.arange(n, dtype=np.int64) if prompt is None else np.asarray(prompt, dtype=np.int64)
        n_groups = int(groups.max(initial=-1)) + 1
        lengths = tuple(int(t) for t in group_tokens) if group_tokens is not None else (int(prefix_tokens),) * n_groups
        # the loader guarantees these for real data; the replay relies on them
        if (inputs < 1).any() or (out < 1).any():
            raise ValueError(f"{name}: every request needs input_tokens >= 1 and output_tokens >= 1")
        if (
            groups.shape != (n,)
            or (groups < -1).any()
            or len(lengths) < n_groups
            or any(t < 0 for t in lengths)
            or ((groups >= 0) & (inputs < np.array(lengths + (0,), dtype=np.int64)[groups])).any()
        ):
            raise ValueError(
                f"{name}: prefix_group needs one group (or -1) per request, each grouped prompt at least "
                f"as long as its group's prefix (group_tokens={lengths[:8]})"
            )
        if prompts.shape != (n,) or (prompts < 0).any() or not _prompts_consistent(prompts, inputs, groups):
            raise ValueError(
                f"{name}: prompt needs one non-negative id per request; requests of one prompt need "
                "one input length and one group"
            )
        return cls(
            name=name,
            model=model,
            workload="",
            tp=tp,
            hardware=get_hardware(hardware),
            arch=arch,
            server=ServerConfig(max_num_seqs, max_num_batched_tokens, kv_blocks, block_size),
            arrival_us=arrival,
            input_tokens=inputs,
            output_tokens=out,
            reported_output_tokens=out.copy(),
            prefix_group=groups,
            group_tokens=lengths[:n_groups],
            prompt=prompts,
            failed=np.zeros(n, bool),
            abort_after_us=np.full(n, int(timeout_s * 1e6), dtype=np.int64),
            e2e_s=np.full(n, np.nan),
            ttft_s=np.full(n, np.nan),
            split=_temporal_split(n, split),
        )

    def trace_view(self) -> tuple[Experiment, list[str]]:
        """The experiment as a BLIS trace v2 states its prompts (prompt_reuse.trace_sharing), and
        the trace's group names: what `blis replay` of the exported trace replays."""
        sharing, names = trace_sharing(self.sharing, self.input_tokens)
        return dataclasses.replace(
            self, prompt=sharing.prompt, prefix_group=sharing.group, group_tokens=sharing.group_tokens
        ), names

    def head(self, n: int) -> Experiment:
        """The experiment cut to its first n requests (in arrival order)."""
        per_request = {
            f.name: getattr(self, f.name)[:n]
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), np.ndarray)
        }  # group_tokens is a tuple: kept whole
        return dataclasses.replace(self, **per_request)

    def split_mask(self, split: str) -> np.ndarray:
        if split == ALL:
            return self.split < len(SPLITS)  # a windowed experiment's window (engine.windowed)
        return self.split == SPLITS.index(split)

    def split_sizes(self) -> dict[str, int]:
        return {s: int((self.split == i).sum()) for i, s in enumerate(SPLITS)}

    def observed_means(self, mask: np.ndarray | None = None) -> dict[str, float]:
        """Mean E2E and TTFT (s) over successful requests (in mask)."""
        ok = ~self.failed if mask is None else (~self.failed & mask)
        if not ok.any():
            return {"e2e_mean_s": math.nan, "ttft_mean_s": math.nan}
        return {"e2e_mean_s": float(self.e2e_s[ok].mean()), "ttft_mean_s": float(self.ttft_s[ok].mean())}


def _prompts_consistent(prompt: np.ndarray, inputs: np.ndarray, groups: np.ndarray) -> bool:
    """Requests that sent one prompt have one length and one group (the replay keys its blocks once)."""
    order = np.argsort(prompt, kind="stable")
    p, i, g = prompt[order], inputs[order], groups[order]
    same = p[1:] == p[:-1]
    return bool(((i[1:] == i[:-1]) & (g[1:] == g[:-1]))[same].all())


def _temporal_split(n: int, fractions: tuple[float, float]) -> np.ndarray:
    cut1 = int(round(n * fractions[0]))
    cut2 = int(round(n * (fractions[0] + fractions[1])))
    split = np.full(n, 2, dtype=np.int8)
    split[:cut1] = 0
    split[cut1:cut2] = 1
    return split
