"""Partial overlap of compute and memory: kernels neither hide their memory traffic behind their
math (the roofline's max) nor serialize them (a sum); the step takes the root of the sum of
squares, between the two, nearest the sum where compute and memory time are alike (mixed
prefill-and-decode steps)."""
CONSTANTS = {
    "base_us": {"start": 1300.0, "min": 0.0, "max": 20000.0},
    "c_compute": {"start": 1.5, "min": 1.0, "max": 100.0},
    "c_memory": {"start": 1.2, "min": 1.0, "max": 100.0},
    "per_req_us": {"start": 14.0, "min": 0.0, "max": 1000.0},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.2, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 40.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    compute = c.c_compute * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc)
    memory = c.c_memory * (f.weights + f.kv_read + f.kv_write)
    return c.base_us + sqrt(compute * compute + memory * memory) + f.allreduce + c.per_req_us * f.n_req


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
