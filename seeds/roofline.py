"""Roofline: a fixed overhead floor plus the larger of compute time and memory time."""
CONSTANTS = {
    "overhead_us": 2000.0,
    "c_compute": 2.0,
    "c_memory": 1.3,
    "queue_us": 2000.0,
    "out_tok_us": 50.0,
}


def step_time(f, c):
    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc
    memory = f.weights + f.kv_read + f.kv_write
    return c.overhead_us + max(c.c_compute * compute, c.c_memory * memory) + f.allreduce


def queueing_time(r, c):
    return c.queue_us


def output_token_time(c):
    return c.out_tok_us
