"""The physical floor: no program may predict a step faster than the hardware allows.

A step's work is what the components count (evaluator/hardware/components.py), and its floor is the
roofline of that work at the hardware's peak, plus the all-reduce:

    floor = max(FLOP time, byte time) + all-reduce time
    FLOP time = gemm_pf + gemm_dc + attn_pf + attn_dc     (GEMMs and attention at peak FLOP/s)
    byte time = weights + kv_read + kv_write               (weights, KV reads and writes at peak HBM)

- MoE: the FLOPs are those of the top-k experts each token is routed to (and the router); the
  bytes are those of the experts the step's tokens touch, E * (1 - (1 - k/E)^tokens) of them per
  layer, as f.weights counts them. A program's step can be no faster than this work at peak.
- All-reduce: tensor parallelism reduces every layer's attention and MLP outputs before the next
  layer can start (vLLM's custom all-reduce sits between dependent kernels), so it adds to the
  roofline rather than hiding under it; its time is the ring's bytes at the link's peak, 0 at TP 1.

The floor is checked on an *envelope* of synthetic steps spanning what users simulate, not only
what the data hold: uncached prefill chunks of 16-8,192 tokens (and chunks on a long context),
many short prompts in one step, decode batches of 1-512 on contexts up to MAX_MODEL_LEN, mixed
steps under token budgets of 64-16,384, for every catalog model on every catalog GPU at every TP
degree whose weights fit (and every deployment of the data at hand), each step only where the
deployment's KV cache can hold it. Data that reach further (a larger token budget or batch, a
longer context) extend the envelope to their reach, so the envelope always covers the data. A
program below the floor anywhere in the envelope is refused before any fit (`floor`), and a fit
never accepts constants that put it below.

Each branch of a conditional is checked on its own: the floor is checked on step_time with every
`a if cond else b` taken as whichever branch is lower (signs.lowest_branch), on every envelope
point, not only where the envelope's steps happen to send the condition.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from stepml_evolve.evaluator.dsl import Program, ProgramError
from stepml_evolve.evaluator.dsl.numexpr_compile import (
    VectorFunction,
    compile_expression,
    compile_vector,
    evaluate_vector,
)
from stepml_evolve.evaluator.dsl.program import inlined
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.hardware.catalog import Hardware, catalog
from stepml_evolve.evaluator.hardware.components import (
    COMPONENT_INDEX,
    K_DENSE_WEIGHT_US,
    K_EXPERT_WEIGHT_US,
    K_KV_US_PER_TOKEN,
    K_NUM_EXPERTS,
    coefficients,
    component_values,
)
from stepml_evolve.evaluator.hardware.model_arch import ModelArch
from stepml_evolve.evaluator.physics.signs import Ranges, has_branches, lowest_branch

MAX_MODEL_LEN = 32_768  # the longest context the envelope holds (long-context deployments of today's models)
TP_DEGREES = (1, 2, 4, 8)
# A deployment is in the envelope when its shard leaves room for MIN_KV_TOKENS of KV at the memory
# share users push vLLM to (its gpu_memory_utilization; CodeLlama-34B is served on one H100 so)
GPU_MEMORY_UTILIZATION = 0.95
ACTIVATION_RESERVE_BYTES = 1.5e9  # activations and CUDA graphs, per GPU
MIN_KV_TOKENS = 4096
TOLERANCE = 1e-6  # relative: a program at the floor exactly (every efficiency at peak) is on it, not below

PREFILL_CHUNKS = (16, 64, 256, 1024, 2048, 4096, 8192)  # uncached prompts, one chunk each
LONG_CONTEXT_CHUNKS = ((512, 4096), (2048, 16_384), (8192, 24_576))  # (chunk, context before it): chunked prefill
MANY_PROMPTS = ((16, 128), (64, 64), (128, 128))  # (prompts, tokens each) prefilled in one step
DECODE_BATCHES = (1, 4, 16, 64, 256, 512)
DECODE_CONTEXTS = (16, 512, 4096, 32_000)
BUDGETS = (64, 512, 2048, 8192, 16_384)  # max_num_batched_tokens of a mixed step
MIXED_DECODES = (1, 32, 256)  # decoding requests (on MIXED_CONTEXT) beside the budget's prefill chunk
MIXED_CONTEXT = 2048


class FloorError(UserError, ValueError):
    """A floor that cannot be computed (an unknown GPU or model): one line naming it."""


@dataclass(frozen=True)
class Deployment:
    """A model served on a GPU at a TP degree, and the KV tokens its cache holds."""

    model: str
    hardware: Hardware
    tp: int
    arch: ModelArch
    kv_tokens: int

    @property
    def label(self) -> str:
        return f"{self.model.split('/')[-1]} on {self.hardware.name} TP {self.tp}"


@dataclass(frozen=True)
class Step:
    """A step's batch: prefill chunks (count, tokens each, context before them) and decodes
    (count, context each)."""

    pf_chunks: int = 0
    pf_tokens: int = 0
    pf_context: int = 0
    decodes: int = 0
    dc_context: int = 0

    @property
    def label(self) -> str:
        parts = []
        if self.pf_chunks:
            each = f"{self.pf_chunks} x " if self.pf_chunks > 1 else ""
            on = f" on a {self.pf_context:,}-token context" if self.pf_context else ""
            parts.append(f"prefill {each}{self.pf_tokens:,} tokens{on}")
        if self.decodes:
            parts.append(f"decode {self.decodes} on {self.dc_context:,}-token contexts")
        return " + ".join(parts)

    @property
    def kv_tokens(self) -> int:
        """KV the step's requests hold once it ran."""
        return self.pf_chunks * (self.pf_context + self.pf_tokens) + self.decodes * (self.dc_context + 1)

    @property
    def longest(self) -> int:
        return max(
            self.pf_context + self.pf_tokens if self.pf_chunks else 0, self.dc_context + 1 if self.decodes else 0
        )

    def totals(self) -> tuple[float, ...]:
        """component_values' batch totals: (tok_pf, n_pf, pf_pairs, pf_ctx, n_dc, dc_ctx, ctx_max)."""
        n, c = self.pf_tokens, self.pf_context
        ctx_max = max(c if self.pf_chunks else 0, self.dc_context if self.decodes else 0)
        return (
            float(self.pf_chunks * n),
            float(self.pf_chunks),
            float(self.pf_chunks * n * (c + n / 2.0)),
            float(self.pf_chunks * c),
            float(self.decodes),
            float(self.decodes * self.dc_context),
            float(ctx_max),
        )


@dataclass(frozen=True)
class Reach:
    """How far the envelope's steps go: the largest token budget, decode batch and context."""

    budget: int = max(BUDGETS)
    batch: int = max(DECODE_BATCHES)
    context: int = MAX_MODEL_LEN

    def covering(self, budget: int, batch: int, context: int) -> Reach:
        return Reach(max(self.budget, budget), max(self.batch, batch), max(self.context, context))


def envelope_steps(reach: Reach = Reach()) -> list[Step]:
    chunks = PREFILL_CHUNKS + ((reach.budget,) if reach.budget > max(BUDGETS) else ())
    batches = DECODE_BATCHES + ((reach.batch,) if reach.batch > max(DECODE_BATCHES) else ())
    contexts = DECODE_CONTEXTS + ((reach.context - 1,) if reach.context > MAX_MODEL_LEN else ())
    budgets = BUDGETS + ((reach.budget,) if reach.budget > max(BUDGETS) else ())
    steps = [Step(1, n) for n in chunks]
    steps += [Step(1, n, c) for n, c in LONG_CONTEXT_CHUNKS]
    if reach.context > MAX_MODEL_LEN:  # the data's longest context, its last chunk prefilled on it
        chunk = min(8192, reach.budget, reach.context // 2)
        steps.append(Step(1, chunk, reach.context - chunk))
    steps += [Step(k, n) for k, n in MANY_PROMPTS]
    steps += [Step(decodes=b, dc_context=c) for b in batches for c in contexts]
    steps += [Step(1, budget - b, 0, b, MIXED_CONTEXT) for budget in budgets for b in MIXED_DECODES if b < budget]
    return steps


def kv_capacity_tokens(arch: ModelArch, hw: Hardware, tp: int) -> int:
    """KV tokens the GPUs hold beside the model's shard (0: it does not fit, or holds too little to serve)."""
    k = coefficients(arch, hw, tp)
    bytes_per_us = hw.hbm_bytes_per_s / 1e6
    weights = (k[K_DENSE_WEIGHT_US] + k[K_EXPERT_WEIGHT_US] * k[K_NUM_EXPERTS]) * bytes_per_us
    per_token = k[K_KV_US_PER_TOKEN] * bytes_per_us
    free = GPU_MEMORY_UTILIZATION * hw.memory_bytes - weights - ACTIVATION_RESERVE_BYTES
    tokens = math.floor(free / per_token) if free > 0 else 0
    return tokens if tokens >= MIN_KV_TOKENS else 0


def catalog_deployments() -> list[Deployment]:
    """Every catalog model on every catalog GPU at every TP degree that leaves its KV cache room."""
    out = []
    for name, served in catalog().models.items():
        for hw in catalog().hardware.values():
            for tp in TP_DEGREES:
                if served.arch.heads % tp == 0 and (kv := kv_capacity_tokens(served.arch, hw, tp)):
                    out.append(Deployment(name, hw, tp, served.arch, kv))
    return out


@dataclass(frozen=True)
class Envelope:
    """Component columns (N_COMPONENTS, n) of every envelope point, its floor (us) and what it is."""

    components: np.ndarray
    floor_us: np.ndarray
    deployment: np.ndarray  # index into deployments, per point
    step: np.ndarray  # index into steps, per point
    deployments: tuple[Deployment, ...]
    steps: tuple[Step, ...]

    def __len__(self) -> int:
        return len(self.floor_us)

    def describe(self, i: int) -> str:
        return f"{self.deployments[self.deployment[i]].label}, {self.steps[self.step[i]].label}"


# The floor's parts, one definition for floor_of, the replay's check (replay/state.py) and the Go
# model's (evolve/go): max(sum of FLOP_TIMES, sum of BYTE_TIMES) + sum of ADDED_TIMES
FLOP_TIMES = ("gemm_pf", "gemm_dc", "attn_pf", "attn_dc")
BYTE_TIMES = ("weights", "kv_read", "kv_write")
ADDED_TIMES = ("allreduce",)


def floor_of(components: np.ndarray) -> np.ndarray:
    """The floor (us) of component columns (N_COMPONENTS, n): max(FLOP time, byte time) + all-reduce."""
    total = lambda names: sum(components[COMPONENT_INDEX[n]] for n in names)  # noqa: E731
    return np.maximum(total(FLOP_TIMES), total(BYTE_TIMES)) + total(ADDED_TIMES)


def build_envelope(deployments: Iterable[Deployment], reach: Reach = Reach()) -> Envelope:
    deployments = tuple(deployments)
    steps = tuple(envelope_steps(reach))
    cols, dep_index, step_index = [], [], []
    for d, dep in enumerate(deployments):
        k = coefficients(dep.arch, dep.hardware, dep.tp)
        for s, step in enumerate(steps):
            if step.kv_tokens <= dep.kv_tokens and step.longest <= reach.context:
                cols.append(np.array(component_values(*step.totals(), k), dtype=np.float64))
                dep_index.append(d)
                step_index.append(s)
    components = np.array(cols).T
    return Envelope(components, floor_of(components), np.array(dep_index), np.array(step_index), deployments, steps)


@functools.cache
def _catalog_envelope() -> Envelope:
    return build_envelope(catalog_deployments())


def envelope_for(experiments: Iterable = ()) -> Envelope:
    """The catalog's envelope, with the deployments of `experiments` (their model, GPU and TP, and
    the KV cache they ran with) that the catalog lacks, and steps as far as the experiments reach
    (their token budget, batch and longest request) where that is beyond the catalog's."""
    base = _catalog_envelope()
    have = {(d.arch, d.hardware.name, d.tp) for d in base.deployments}
    extra, reach = [], Reach()
    for e in experiments:
        hw = getattr(e, "hardware", None)
        if not isinstance(hw, Hardware):
            raise FloorError(f"{e.name}: the floor needs the experiment's GPU, and {hw!r} is not a known one")
        key = (e.arch, hw.name, e.tp)
        if key not in have:
            have.add(key)
            extra.append(Deployment(e.model, hw, e.tp, e.arch, e.server.kv_blocks * e.server.block_size))
        longest = int((e.input_tokens + e.output_tokens).max()) if e.n_requests else 0
        reach = reach.covering(e.server.max_num_batched_tokens, e.server.max_num_seqs, longest)
    if not extra and reach == Reach():
        return base
    return build_envelope((*base.deployments, *extra), reach)


@dataclass(frozen=True)
class FloorCheck:
    """A program's step times against the floor over the envelope, at one constant vector."""

    ratio: float  # the smallest step time / floor over the envelope (nan: a step time was not finite)
    worst: str  # the point where it is smallest (or the first non-finite one)
    branch: bool = False  # the smallest is a branch's that the point's own condition does not take

    @property
    def margin(self) -> float:
        """ratio - 1: how far above the floor the program stays where it comes closest (< 0: below)."""
        return self.ratio - 1.0

    @property
    def ok(self) -> bool:
        return self.ratio >= 1.0 - TOLERANCE

    def reason(self) -> str:
        what = (
            "a branch of step_time (each `a if cond else b` is held to the floor on its own, wherever a "
            "user could send it)"
            if self.branch
            else "step_time"
        )
        if math.isnan(self.ratio):
            return f"{what} is not a finite number at {self.worst}"
        return (
            f"{what} is {self.ratio:.3g}x the physical floor (the roofline of the step's work at the "
            f"hardware's peak) at {self.worst}"
        )

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "ratio": None if math.isnan(self.ratio) else self.ratio,
            "worst": self.worst,
            "branch": self.branch,
        }


def _vector(program: Program, lowest: bool) -> VectorFunction:
    """step_time compiled for arrays; `lowest`: with each branch at its lowest (the floor's view)."""
    key = ("floor-vector", lowest)
    vf = program._cache.get(key)
    if vf is None:
        expr = inlined(program.functions["step_time"]) if lowest else None
        if expr is not None and has_branches(expr):
            vf = compile_expression(lowest_branch(expr, Ranges(program)))
        else:
            vf = compile_vector(program, "step_time")
        program._cache[key] = vf
    return vf


def step_ratios(program: Program, constants: np.ndarray, env: Envelope, lowest: bool = False) -> np.ndarray:
    """step_time / floor at every envelope point for each constant vector: (P, n) for (P, K)
    constants; NaN where a step time is not finite. `lowest`: each branch at its lowest."""
    vf = _vector(program, lowest)
    constants = np.atleast_2d(np.asarray(constants, dtype=np.float64))
    inputs = {f"f_{name}": env.components[i] for name, i in COMPONENT_INDEX.items()}
    for j, name in enumerate(program.constants):
        inputs[f"c_{name}"] = constants[:, j, None]
    with np.errstate(all="ignore"):
        steps = np.broadcast_to(evaluate_vector(vf, inputs), (len(constants), len(env)))
        ratio = steps / env.floor_us
    return np.where(np.isfinite(ratio), ratio, np.nan)


def check_floor(
    program: Program, constants: dict[str, float] | np.ndarray | None = None, env: Envelope | None = None
) -> FloorCheck:
    """The program (at `constants`, default its own) against the floor over the envelope, each
    branch on its own."""
    env = env or _catalog_envelope()
    if constants is None:
        constants = program.constants
    v = np.array([constants[k] for k in program.constants] if isinstance(constants, dict) else constants, dtype=float)
    ratio = step_ratios(program, v, env, lowest=True)[0]
    bad = np.flatnonzero(np.isnan(ratio))
    i = int(bad[0]) if len(bad) else int(np.argmin(ratio))
    value = math.nan if len(bad) else float(ratio[i])
    branch = False
    if not value >= 1.0 - TOLERANCE and _vector(program, True) is not _vector(program, False):
        taken = step_ratios(program, v, env)[0][i]
        branch = bool(taken >= 1.0 - TOLERANCE)
    return FloorCheck(value, env.describe(i), branch)


def below_floor(program: Program, population: np.ndarray, env: Envelope) -> np.ndarray:
    """For a fit: how far each constant vector (P, K) puts the program below the floor, as the
    largest shortfall (1 - step / floor) over the envelope, each branch on its own; 0 where it stays
    at or above it, inf where a step time is not finite."""
    ratio = step_ratios(program, population, env, lowest=True)
    short = np.where(np.isnan(ratio), np.inf, 1.0 - ratio).max(axis=1)
    return np.where(short > TOLERANCE, short, 0.0)


def floor_error(program: Program, check: FloorCheck, origin: str = "") -> ProgramError:
    """The `floor` rejection of a program below the floor."""
    return ProgramError(None, "floor", check.reason(), origin)
