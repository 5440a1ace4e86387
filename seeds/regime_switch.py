"""Regime switch: above a prefill-token threshold the step is compute-bound, below it
memory-bound; each regime has its own scale."""
# Bounds (the fit keeps every constant inside them): c_* multiply times at the hardware's peak,
# and no kernel beats the peak, so min 1; max 100 (1% of peak) is generous. But in the light
# (memory-bound) regime the compute runs under the memory reads c_memory already counts, so
# c_light_compute is extra time: min 0. base_us >= 0. Each branch holds the floor on its own,
# wherever a user's step sends the switch (--physics check): a light step is never faster than its
# compute at the heavy regime's efficiency, as a heavy one is not.
# switch_tokens compares with f.tok_pf, which never exceeds the token budget
# (max_num_batched_tokens, 2048 in the real and the synthetic data): [0, 2048]. Per-request
# delays, from the real data (../shared/data/replay): every TTFT contains queue_us + out_tok_us
# and the fastest TTFT of any request is 15.8 ms, so queue_us <= 15000; every later token costs
# a step plus out_tok_us and the fastest mean inter-token time is 6.16 ms, so out_tok_us <= 6000.
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
    "base_us": {"start": 1500.0, "min": 0.0, "prior": 1500.0, "spread": 0.7},
    "switch_tokens": {"start": 256.0, "min": 0.0, "max": 2048.0, "prior": 256.0, "spread": 1.0},
    "c_compute": {"start": 1.45, "min": 1.0, "max": 100.0, "prior": 1.45, "spread": 0.12},
    "c_memory": {"start": 1.2, "min": 1.0, "max": 100.0, "prior": 1.2, "spread": 0.12},
    "c_light_compute": {"start": 1.0, "min": 0.0, "max": 100.0, "prior": 1.0, "spread": 0.7},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0, "prior": 2000.0, "spread": 1.0},
    "lag_steps": {"start": 1.5, "min": 0.0, "max": 4.0, "prior": 1.5, "spread": 0.5},
    "out_tok_us": {"start": 45.0, "min": 0.0, "max": 6000.0, "prior": 45.0, "spread": 0.7},
}


def step_time(f, c):
    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc
    memory = f.weights + f.kv_read + f.kv_write
    heavy = max(c.c_compute * compute, c.c_memory * memory)
    light = max(c.c_compute * compute, c.c_memory * memory + c.c_light_compute * compute)
    return c.base_us + f.allreduce + (heavy if f.tok_pf > c.switch_tokens else light)


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
