"""Trained-physics basis (BLIS's terms, each at its own efficiency): prefill and decode FLOPs,
weight reads and KV traffic, then all-reduce and per-layer, per-request and per-step overheads.
One forward pass reads the weights while it computes, so the FLOP terms and the byte terms meet
in a roofline (the larger of the two sums), where BLIS adds them all."""
# Bounds (the fit keeps every constant inside them): the beta_* multiply times at the hardware's
# peak (FLOP/s, HBM and NVLink bandwidth), and no kernel beats the peak, so min 1; max 100 (1 % of
# peak) is generous, and leaves beta_allreduce room for the all-reduce's per-call latency, which
# the bandwidth-only component lacks. Overheads >= 0.
# The roofline, not BLIS's sum: a sum counts a mixed step twice. On CodeLlama-34B at a 64-token
# budget, a step's prefill chunk computes for 6 ms while its weights stream for 24 ms; the sum
# fitted on the cached-prompt data predicted such a run 30 % slow (issue 52).
# Per-request delays, from the real data (../shared/data/replay): every TTFT contains queue_us +
# out_tok_us and the fastest TTFT of any request is 15.8 ms (Mixtral-8x7B general; Llama-2-7B's
# fastest are 16.3 ms), so queue_us <= 15000; every later token costs a step plus out_tok_us and
# the fastest mean inter-token time of any request is 6.16 ms (Llama-2-7B codegen), so
# out_tok_us <= 6000. lag_steps: vLLM's engine schedules a step ahead of the one running, so a
# request that arrives mid-step waits out that step and more before its prefill runs; across the
# real data the median TTFT is 3.0-3.3 mean inter-token times at every light load
# (docs/HISTORY.md, "Where a cached prompt's TTFT goes"), about 1.5 steps more than a replay
# without it gives. r.last_step_us is the step in flight at the arrival; [0, 4] steps.
# Priors: seeds/priors.yaml gives each constant's, with its source (docs/concepts/priors.md). The fit adds
# z^2 loss points for a constant z spreads from its prior's centre, so what the data cannot decide
# (prefill compute, on prompts the prefix cache served) stays where physics puts it. Each start is
# its prior's centre.
CONSTANTS = {
    "beta_pf_gemm": {"start": 1.45, "min": 1.0, "max": 100.0, "prior": 1.45, "spread": 0.12},
    "beta_pf_attn": {"start": 1.6, "min": 1.0, "max": 100.0, "prior": 1.6, "spread": 0.25},
    "beta_dc_gemm": {"start": 2.5, "min": 1.0, "max": 100.0, "prior": 2.5, "spread": 0.5},
    "beta_dc_attn": {"start": 2.5, "min": 1.0, "max": 100.0, "prior": 2.5, "spread": 0.5},
    "beta_weights": {"start": 1.2, "min": 1.0, "max": 100.0, "prior": 1.2, "spread": 0.12},
    "beta_kv": {"start": 1.35, "min": 1.0, "max": 100.0, "prior": 1.35, "spread": 0.2},
    "beta_allreduce": {"start": 2.0, "min": 1.0, "max": 100.0, "prior": 2.0, "spread": 0.7},
    "per_layer_us": {"start": 30.0, "min": 0.0, "prior": 30.0, "spread": 0.7},
    "per_request_us": {"start": 5.0, "min": 0.0, "prior": 5.0, "spread": 1.0},
    "base_us": {"start": 150.0, "min": 0.0, "prior": 150.0, "spread": 1.0},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0, "prior": 2000.0, "spread": 1.0},
    "lag_steps": {"start": 1.5, "min": 0.0, "max": 4.0, "prior": 1.5, "spread": 0.5},
    "out_tok_us": {"start": 45.0, "min": 0.0, "max": 6000.0, "prior": 45.0, "spread": 0.7},
}


def step_time(f, c):
    compute = c.beta_pf_gemm * f.gemm_pf + c.beta_pf_attn * f.attn_pf + c.beta_dc_gemm * f.gemm_dc + c.beta_dc_attn * f.attn_dc
    memory = c.beta_weights * f.weights + c.beta_kv * (f.kv_read + f.kv_write)
    overhead = c.per_layer_us * f.layers + c.per_request_us * f.n_req + c.base_us
    return max(compute, memory) + c.beta_allreduce * f.allreduce + overhead


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
