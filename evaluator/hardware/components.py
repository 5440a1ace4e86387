"""Analytical per-step components: the physics every program builds on.

One definition, three uses. `component_values` maps a step's batch totals to the component
vector using arithmetic only, so the same function runs
  * on scalars inside the compiled replay loop (O(1) per step, see `replay/scheduler.py`),
  * on numpy arrays of per-step totals reduced from a recorded trajectory (`from_trajectory`),
  * and, translated to Go with `coefficient_values`, in the emitted simulator model (see
    "Translated to Go" below for what the two functions may contain).

Times are microseconds at the hardware's peak (a scale constant of 1.0 = peak); counts are
plain counts. Formulas (per layer L, hidden d, heads H, head dim dh, KV width dkv, FFN dff,
TP degree tp, experts E with top-k, 2-byte weights and KV):
  GEMM FLOPs for T tokens     2*T*(d*(d+2*dkv) + d*d) + 2*T*3*d*dff        (dense MLP)
                              ... + 2*T*k*3*d*dff + 2*T*d*E                   (MoE MLP + router)
  attention FLOPs, prefill    4*H*dh*n*(c + n/2) for a chunk of n tokens on context c
  attention FLOPs, decode     4*H*dh*(c + 1)
  weight bytes                2*(L*(attention + router/dense MLP) + vocab*d) + 2*L*touched*3*d*dff
                              with touched = E*(1-(1-k/E)^T) experts per layer (MoE only)
  KV bytes                    read 2*L*dkv*2*sum(context), write 2*L*dkv*2*tokens
  all-reduce                  2 per layer of 2*(tp-1)/tp*T*d*2 bytes over the link (per GPU)
FLOPs and bytes are divided by tp (sharded); the all-reduce bytes are already per GPU.
`context` is the number of tokens already in the KV cache before the step's new tokens.
"""

from __future__ import annotations

import numpy as np

from stepml_evolve.evaluator.hardware.catalog import Hardware
from stepml_evolve.evaluator.hardware.model_arch import BYTES_PER_KV_ELEM, BYTES_PER_PARAM, ModelArch

# Name, unit, meaning. The order is the index used by compiled programs.
COMPONENTS: list[tuple[str, str, str]] = [
    ("gemm_pf", "us", "prefill GEMM time (projections + MLP) at peak FLOP/s"),
    ("gemm_dc", "us", "decode GEMM time at peak FLOP/s"),
    ("attn_pf", "us", "prefill attention FLOP time (chunk on its context) at peak"),
    ("attn_dc", "us", "decode attention FLOP time at peak"),
    ("weights", "us", "weight read time at peak HBM bandwidth (MoE: experts touched only)"),
    ("kv_read", "us", "KV-cache read time for all contexts at peak HBM bandwidth"),
    ("kv_write", "us", "KV-cache write time for the step's new tokens at peak HBM bandwidth"),
    ("allreduce", "us", "tensor-parallel all-reduce time over the link (0 at tp=1)"),
    ("experts", "count", "expected experts touched per layer (0 for dense models)"),
    ("n_req", "count", "requests scheduled in the step"),
    ("n_pf", "count", "prefill requests (chunks) in the step"),
    ("n_dc", "count", "decode requests in the step (= decode tokens)"),
    ("tok_pf", "count", "prefill tokens in the step"),
    ("tokens", "count", "all new tokens in the step"),
    ("ctx_sum", "count", "sum of contexts (tokens already cached) over scheduled requests"),
    ("ctx_max", "count", "largest context among scheduled requests"),
    ("layers", "count", "transformer layers L"),
    ("tp", "count", "tensor-parallel degree"),
]
COMPONENT_NAMES: list[str] = [c[0] for c in COMPONENTS]
TIME_COMPONENTS: frozenset[str] = frozenset(c[0] for c in COMPONENTS if c[1] == "us")
COMPONENT_INDEX: dict[str, int] = {n: i for i, n in enumerate(COMPONENT_NAMES)}
N_COMPONENTS = len(COMPONENTS)


def dropped_time_components(parent: list[str], child: list[str]) -> list[str]:
    """The time components the parent uses and the child does not (`--time-components keep`
    rejects such a child: a step on new hardware still does that work, and a term fitted in its
    place carries the trained hardware's speed to the new one)."""
    return [c for c in parent if c in TIME_COMPONENTS and c not in child]


# Steps unlike each other (a prefill chunk, a decode batch, a mixed step) on which a component
# that does not vary with the data shows it: (tok_pf, n_pf, pf_pairs, pf_ctx, n_dc, dc_ctx, ctx_max).
PROBE_STEPS = (
    (512, 2, 2 * 256 * (0 + 128), 0, 0, 0, 0),
    (0, 0, 0, 0, 16, 16_000, 1_500),
    (100, 1, 100 * 450, 400, 5, 3_000, 900),
)


def unexercised_components(coefficient_vectors: list[np.ndarray]) -> list[str]:
    """The components the data cannot judge a use of: a time component that is 0 in every step of
    every experiment (f.allreduce when all run at tp 1), or a count that never changes (f.tp at
    one TP, f.layers of one model, f.experts of dense models). A term in one fits the training
    data exactly as well at any constant, and is arbitrary on the deployment that exercises it."""
    values = np.array([component_values(*step, k) for k in coefficient_vectors for step in PROBE_STEPS])
    if not len(values):
        return []
    fixed = np.ptp(values, axis=0) == 0
    return [
        name
        for (name, unit, _), same, value in zip(COMPONENTS, fixed, values[0])
        if same and (unit == "count" or value == 0)
    ]


# Slots of the per-experiment coefficient vector consumed by `component_values`.
K_GEMM_US_PER_TOKEN = 0
K_ATTN_US_PER_PAIR = 1  # per (query token, key token) pair
K_DENSE_WEIGHT_US = 2  # attention + router/dense MLP + lm_head, read once per step
K_EXPERT_WEIGHT_US = 3  # one expert's weights in one layer
K_NUM_EXPERTS = 4
K_TOPK_FRACTION = 5  # k/E
K_KV_US_PER_TOKEN = 6  # one token's K and V across all layers
K_ALLREDUCE_US_PER_TOKEN = 7
K_LAYERS = 8
K_TP = 9
N_COEFFICIENTS = 10


def coefficients(arch: ModelArch, hw: Hardware, tp: int) -> np.ndarray:
    """Per-experiment constants of the formulas, in microseconds per unit of work."""
    return np.array(
        coefficient_values(
            arch.layers,
            arch.hidden,
            arch.heads,
            arch.head_dim,
            arch.kv_heads,
            arch.ffn,
            arch.vocab,
            arch.num_experts,
            arch.top_k,
            hw.peak_flops,
            hw.hbm_bytes_per_s,
            hw.link_bytes_per_s,
            tp,
        ),
        dtype=np.float64,
    )


# ---- Translated to Go ---------------------------------------------------------------------
# `coefficient_values` and `component_values` are also the Go model's physics: evolve/go/components.py
# parses their source (inspect.getsource) and translates the AST, and the emitted Go must match
# Python to the microsecond (tests/evolve/test_emit_go.py). Their bodies may contain only:
#   * a docstring, then assignments `name = expr` (one target, each name assigned once);
#   * a final `return (a, b, ...)` of names: in COMPONENTS order for component_values; in K_*
#     slot order for coefficient_values, each slot K_FOO_BAR returned as the name `foo_bar`;
#   * in expressions: the parameters, earlier locals, int/float literals, int/float UPPER_CASE
#     constants of this module (e.g. BYTES_PER_PARAM), + - * / **, unary minus, and parentheses;
#     `k[K_*]` (component_values); `a if x < y else b` with one comparison (coefficient_values
#     only: component_values also runs on numpy arrays).
# Nothing else: no calls (numpy, max, int, ...), attributes, //, %, loops, ifs or `+=`.
# A new parameter of coefficient_values needs its Go value in COEFFICIENT_ARGUMENTS in evolve/go/components.py.
# Python gets the architecture as ints (exact) and Go as float64: integer intermediates must
# stay below 2**53 (true for any real model, ~1e14 at most), so both round at the same divisions.


def coefficient_values(
    layers,
    hidden,
    heads,
    head_dim,
    kv_heads,
    ffn,
    vocab,
    num_experts,
    top_k,
    peak_flops,
    hbm_bytes_per_s,
    link_bytes_per_s,
    tp,
):
    """The coefficient vector in K_* slot order, from architecture sizes (element counts; head_dim
    = hidden // heads; num_experts = top_k = 0 for dense models), hardware peaks (FLOP/s, bytes/s)
    and the TP degree."""
    us = 1e6
    kv_dim = kv_heads * head_dim
    attn_params = hidden * (hidden + 2 * kv_dim) + hidden * hidden  # QKV projection + output projection
    expert_params = 3 * hidden * ffn  # gate, up, down of one expert (or of the dense MLP)
    dense_params = (attn_params + hidden * num_experts) if num_experts > 0 else (attn_params + expert_params)
    mlp_flops_per_token = 2 * 3 * hidden * ffn * (top_k if num_experts > 0 else 1)
    router_flops_per_token = 2 * hidden * num_experts
    gemm_flops_per_token = layers * (2 * attn_params + mlp_flops_per_token + router_flops_per_token)
    dense_bytes = (layers * dense_params + vocab * hidden) * BYTES_PER_PARAM  # attention, router or MLP, lm_head

    gemm_us_per_token = gemm_flops_per_token / tp / peak_flops * us
    attn_us_per_pair = 4 * heads * head_dim * layers / tp / peak_flops * us
    dense_weight_us = dense_bytes / tp / hbm_bytes_per_s * us
    expert_weight_us = layers * expert_params * BYTES_PER_PARAM / tp / hbm_bytes_per_s * us if num_experts > 0 else 0.0
    topk_fraction = top_k / num_experts if num_experts > 0 else 0.0
    kv_us_per_token = 2 * layers * kv_dim * BYTES_PER_KV_ELEM / tp / hbm_bytes_per_s * us
    allreduce_us_per_token = 2 * layers * (2 * (tp - 1) / tp) * hidden * BYTES_PER_KV_ELEM / link_bytes_per_s * us
    return (
        gemm_us_per_token,
        attn_us_per_pair,
        dense_weight_us,
        expert_weight_us,
        num_experts,
        topk_fraction,
        kv_us_per_token,
        allreduce_us_per_token,
        layers,
        tp,
    )


def component_values(tok_pf, n_pf, pf_pairs, pf_ctx, n_dc, dc_ctx, ctx_max, k):
    """Component values (in COMPONENTS order) for one step's batch totals.

    tok_pf: prefill tokens; n_pf: prefill requests; pf_pairs: sum over prefill chunks of
    n*(c + n/2); pf_ctx: sum of prefill contexts c; n_dc: decode requests; dc_ctx: sum of
    decode contexts; ctx_max: largest context. Scalars or equal-shape arrays (arithmetic only).
    """
    tokens = tok_pf + n_dc
    ctx_sum = pf_ctx + dc_ctx
    gemm_pf = k[K_GEMM_US_PER_TOKEN] * tok_pf
    gemm_dc = k[K_GEMM_US_PER_TOKEN] * n_dc
    attn_pf = k[K_ATTN_US_PER_PAIR] * pf_pairs
    attn_dc = k[K_ATTN_US_PER_PAIR] * (dc_ctx + n_dc)
    experts = k[K_NUM_EXPERTS] * (1.0 - (1.0 - k[K_TOPK_FRACTION]) ** tokens)
    weights = k[K_DENSE_WEIGHT_US] + k[K_EXPERT_WEIGHT_US] * experts
    kv_read = k[K_KV_US_PER_TOKEN] * ctx_sum
    kv_write = k[K_KV_US_PER_TOKEN] * tokens
    allreduce = k[K_ALLREDUCE_US_PER_TOKEN] * tokens
    n_req = n_pf + n_dc
    layers = k[K_LAYERS] + 0.0 * tokens
    tp = k[K_TP] + 0.0 * tokens
    return (
        gemm_pf,
        gemm_dc,
        attn_pf,
        attn_dc,
        weights,
        kv_read,
        kv_write,
        allreduce,
        experts,
        n_req,
        n_pf,
        n_dc,
        tok_pf,
        tokens,
        ctx_sum,
        ctx_max,
        layers,
        tp,
    )


def from_trajectory(step, new_tokens, context, is_prefill, n_steps: int, k: np.ndarray) -> np.ndarray:
    """Components for every step of a recorded trajectory, shape (N_COMPONENTS, n_steps).

    The trajectory is flat over scheduled request-slots: for each slot its step index, new
    tokens, context before the step and whether it is a prefill chunk.
    """
    step = np.asarray(step, dtype=np.int64)
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    pf = np.asarray(is_prefill, dtype=bool)
    dc = ~pf

    def per_step(weights):
        return np.bincount(step, weights=weights, minlength=n_steps).astype(np.float64)

    ctx_max = np.zeros(n_steps)
    np.maximum.at(ctx_max, step, c)
    totals = (
        per_step(n * pf),
        per_step(pf.astype(np.float64)),
        per_step(pf * n * (c + n / 2.0)),
        per_step(pf * c),
        per_step(dc.astype(np.float64)),
        per_step(dc * c),
        ctx_max,
    )
    return np.array(component_values(*totals, k), dtype=np.float64)
