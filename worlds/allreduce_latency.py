"""All-reduce latency: each layer's two all-reduces pay a per-call latency that grows with the
log2 of the TP degree (a tree of log2(tp) hops), on top of the bandwidth term, and neither
overlaps the GEMMs. Small decode steps at TP 4-8 are latency-bound on the collectives."""
CONSTANTS = {
    "base_us": {"start": 1500.0, "min": 0.0, "max": 20000.0},
    "c_compute": {"start": 1.7, "min": 1.0, "max": 100.0},
    "c_memory": {"start": 1.35, "min": 1.0, "max": 100.0},
    "c_comm": {"start": 1.4, "min": 1.0, "max": 100.0},
    "hop_us": {"start": 9.0, "min": 0.0, "max": 1000.0},
    "queue_us": {"start": 2100.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.1, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 40.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    compute = c.c_compute * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc)
    memory = c.c_memory * (f.weights + f.kv_read + f.kv_write)
    hops = 1.4426950408889634 * log(f.tp)
    collectives = c.c_comm * f.allreduce + c.hop_us * 2 * f.layers * hops
    return c.base_us + max(compute, memory) + collectives


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
