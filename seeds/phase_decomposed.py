"""Phase-decomposed: prefill chunks pay compute, decode pays the larger of compute and memory,
with per-request and base overheads."""
# Bounds (the fit keeps every constant inside them): c_* multiply times at the hardware's peak
# (FLOP/s, HBM and NVLink bandwidth), and no kernel beats the peak, so min 1; max 100 (1% of
# peak) is generous, and leaves c_comm room for the all-reduce's per-call latency, which the
# bandwidth-only component lacks. Overheads >= 0. Per-request delays, from the real data
# (../shared/data/replay): every TTFT contains queue_us + out_tok_us and the fastest TTFT of any
# request is 15.8 ms, so queue_us <= 15000; every later token costs a step plus out_tok_us and
# the fastest mean inter-token time of any request is 6.16 ms, so out_tok_us <= 6000.
# lag_steps: vLLM's engine schedules a step ahead of the one running, so a request that arrives
# mid-step waits out that step and more before its prefill runs; across the real data the median
# TTFT is 3.0-3.3 mean inter-token times at every light load (docs/results.md, "Where a cached
# prompt's TTFT goes"), about 1.5 steps more than a replay without it gives. r.last_step_us is the
# step in flight at the arrival; [0, 4] steps.
CONSTANTS = {
    "base_us": {"start": 1500.0, "min": 0.0},
    "c_prefill": {"start": 2.0, "min": 1.0, "max": 100.0},
    "c_decode_compute": {"start": 2.0, "min": 1.0, "max": 100.0},
    "c_decode_memory": {"start": 1.3, "min": 1.0, "max": 100.0},
    "per_request_us": {"start": 20.0, "min": 0.0},
    "c_comm": {"start": 1.0, "min": 1.0, "max": 100.0},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.5, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 50.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    prefill = c.c_prefill * (f.gemm_pf + f.attn_pf)
    decode = max(c.c_decode_compute * (f.gemm_dc + f.attn_dc), c.c_decode_memory * (f.weights + f.kv_read))
    return c.base_us + prefill + decode + c.per_request_us * f.n_req + c.c_comm * f.allreduce


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
