"""Input preparation on the critical path: before each step the CPU builds the batch's block
tables and slot mappings, work that grows with the KV blocks of every scheduled request (their
contexts / 16), and the GPU waits for it. Long contexts at large batches pay milliseconds a step."""
CONSTANTS = {
    "prep_us": {"start": 700.0, "min": 0.0, "max": 20000.0},
    "per_req_us": {"start": 12.0, "min": 0.0, "max": 1000.0},
    "per_block_us": {"start": 0.18, "min": 0.0, "max": 100.0},
    "c_compute": {"start": 1.7, "min": 1.0, "max": 100.0},
    "c_memory": {"start": 1.3, "min": 1.0, "max": 100.0},
    "queue_us": {"start": 1900.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.1, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 40.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    prep = c.prep_us + c.per_req_us * f.n_req + c.per_block_us * f.ctx_sum / 16
    gpu = max(c.c_compute * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc), c.c_memory * (f.weights + f.kv_read + f.kv_write))
    return prep + gpu + f.allreduce


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
