"""Phase-decomposed roofline (BLIS's roofline backend, with overheads): prefill and decode FLOPs at
their own efficiencies (its mfuPrefill and mfuDecode) under one roofline with the weight and KV
traffic, plus the all-reduce and per-request and per-step overheads."""
# Bounds (the fit keeps every constant inside them): c_* multiply times at the hardware's peak
# (FLOP/s, HBM and NVLink bandwidth), and no kernel beats the peak, so min 1; max 100 (1 % of
# peak) is generous, and leaves c_comm room for the all-reduce's per-call latency, which the
# bandwidth-only component lacks. Overheads >= 0.
# One roofline, not a prefill term added to the decode's: a mixed step is one forward pass, and
# its prefill chunk computes while the weights stream (added, a 64-token budget's run on
# CodeLlama-34B came out 11 % slow, a prefill-heavy one 25 %: issue 52).
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
    "base_us": {"start": 1500.0, "min": 0.0, "prior": 1500.0, "spread": 0.7},
    "c_prefill": {"start": 1.45, "min": 1.0, "max": 100.0, "prior": 1.45, "spread": 0.12},
    "c_decode_compute": {"start": 2.5, "min": 1.0, "max": 100.0, "prior": 2.5, "spread": 0.5},
    "c_decode_memory": {"start": 1.2, "min": 1.0, "max": 100.0, "prior": 1.2, "spread": 0.12},
    "per_request_us": {"start": 5.0, "min": 0.0, "prior": 5.0, "spread": 1.0},
    "c_comm": {"start": 2.0, "min": 1.0, "max": 100.0, "prior": 2.0, "spread": 0.7},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0, "prior": 2000.0, "spread": 1.0},
    "lag_steps": {"start": 1.5, "min": 0.0, "max": 4.0, "prior": 1.5, "spread": 0.5},
    "out_tok_us": {"start": 45.0, "min": 0.0, "max": 6000.0, "prior": 45.0, "spread": 0.7},
}


def step_time(f, c):
    compute = c.c_prefill * (f.gemm_pf + f.attn_pf) + c.c_decode_compute * (f.gemm_dc + f.attn_dc)
    memory = c.c_decode_memory * (f.weights + f.kv_read + f.kv_write)
    return c.base_us + max(compute, memory) + c.per_request_us * f.n_req + c.c_comm * f.allreduce


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
