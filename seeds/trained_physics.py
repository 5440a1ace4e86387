"""Trained-physics basis (as in BLIS): a linear sum of separate prefill and decode compute
terms, weight reads, KV traffic, all-reduce, per-layer and per-request overheads and a constant."""
# Bounds (the fit keeps every constant inside them; unbounded, a fit on the real data set
# beta_pf_gemm to 0.068, prefill GEMMs at 15x the peak, and queue_us to 17 ms, more than the
# fastest TTFT). The beta_* multiply times at the hardware's peak (FLOP/s, HBM and NVLink
# bandwidth), and no kernel beats the peak, so min 1 and max 100 (1% of peak: generous, and room
# for the all-reduce's per-call latency, which the bandwidth-only component lacks). Except the
# FLOP terms of decode: decode GEMMs and attention are memory-bound (at most 128 tokens a step,
# below the H100's 295 FLOP/byte ridge), so their time is the weight and KV reads beta_weights
# and beta_kv already carry, and in this sum their FLOP terms are extra time: min 0. (With min 1
# there too, the sum counts decode GEMMs twice and tips Llama-2-70B and CodeLlama general into
# saturation: the fit with seed 7 ended at train loss 673, against 80 with min 0.)
# Overheads >= 0. Per-request delays, from the real data (../shared/data/replay): every TTFT
# contains queue_us + out_tok_us and the fastest TTFT of any request is 15.8 ms (Mixtral-8x7B
# general; Llama-2-7B's fastest are 16.3 ms), so queue_us <= 15000; every later token costs a
# step plus out_tok_us and the fastest mean inter-token time of any request is 6.16 ms
# (Llama-2-7B codegen), so out_tok_us <= 6000.
# lag_steps: vLLM's engine schedules a step ahead of the one running, so a request that arrives
# mid-step waits out that step and more before its prefill runs; across the real data the median
# TTFT is 3.0-3.3 mean inter-token times at every light load (docs/results.md, "Where a cached
# prompt's TTFT goes"), about 1.5 steps more than a replay without it gives. r.last_step_us is the
# step in flight at the arrival; [0, 4] steps.
CONSTANTS = {
    "beta_pf_gemm": {"start": 1.5, "min": 1.0, "max": 100.0},
    "beta_pf_attn": {"start": 1.5, "min": 1.0, "max": 100.0},
    "beta_dc_gemm": {"start": 1.5, "min": 0.0, "max": 100.0},
    "beta_dc_attn": {"start": 1.5, "min": 0.0, "max": 100.0},
    "beta_weights": {"start": 1.2, "min": 1.0, "max": 100.0},
    "beta_kv": {"start": 1.2, "min": 1.0, "max": 100.0},
    "beta_allreduce": {"start": 1.0, "min": 1.0, "max": 100.0},
    "per_layer_us": {"start": 30.0, "min": 0.0},
    "per_request_us": {"start": 10.0, "min": 0.0},
    "base_us": {"start": 500.0, "min": 0.0},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.5, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 50.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    compute = c.beta_pf_gemm * f.gemm_pf + c.beta_pf_attn * f.attn_pf + c.beta_dc_gemm * f.gemm_dc + c.beta_dc_attn * f.attn_dc
    memory = c.beta_weights * f.weights + c.beta_kv * (f.kv_read + f.kv_write)
    overhead = c.per_layer_us * f.layers + c.per_request_us * f.n_req + c.base_us
    return compute + memory + c.beta_allreduce * f.allreduce + overhead


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
