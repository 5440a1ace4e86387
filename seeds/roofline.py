"""Roofline: a fixed overhead floor plus the larger of compute time and memory time."""
# Bounds (the fit keeps every constant inside them): c_compute and c_memory multiply times at the
# hardware's peak, and no kernel beats the peak, so min 1; max 100 (1% of peak) is generous.
# overhead_us >= 0. queue_us and out_tok_us are per-request delays the real data bound: every
# TTFT contains queue_us + out_tok_us, and the fastest TTFT of any request in
# ../shared/data/replay is 15.8 ms (Mixtral-8x7B general; Llama-2-7B's fastest are 16.3 ms), so
# queue_us <= 15000; every later token costs a step plus out_tok_us, and the fastest mean
# inter-token time of any request is 6.16 ms (Llama-2-7B codegen), so out_tok_us <= 6000.
# lag_steps: vLLM's engine schedules a step ahead of the one running, so a request that arrives
# mid-step waits out that step and more before its prefill runs; across the real data the median
# TTFT is 3.0-3.3 mean inter-token times at every light load (docs/HISTORY.md, "Where a cached
# prompt's TTFT goes"), about 1.5 steps more than a replay without it gives. r.last_step_us is the
# step in flight at the arrival; [0, 4] steps.
# Priors: seeds/priors.yaml gives each constant's, with its source (docs/concepts/priors.md). The fit adds
# z^2 loss points for a constant z spreads from its prior's centre, so what the data cannot decide
# (prefill compute, on prompts the prefix cache served) stays where physics puts it. Each start is
# its prior's centre.
CONSTANTS = {
    "overhead_us": {"start": 1500.0, "min": 0.0, "prior": 1500.0, "spread": 0.7},
    "c_compute": {"start": 1.45, "min": 1.0, "max": 100.0, "prior": 1.45, "spread": 0.12},
    "c_memory": {"start": 1.2, "min": 1.0, "max": 100.0, "prior": 1.2, "spread": 0.12},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0, "prior": 2000.0, "spread": 1.0},
    "lag_steps": {"start": 1.5, "min": 0.0, "max": 4.0, "prior": 1.5, "spread": 0.5},
    "out_tok_us": {"start": 45.0, "min": 0.0, "max": 6000.0, "prior": 45.0, "spread": 0.7},
}


def step_time(f, c):
    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc
    memory = f.weights + f.kv_read + f.kv_write
    return c.overhead_us + max(c.c_compute * compute, c.c_memory * memory) + f.allreduce


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
