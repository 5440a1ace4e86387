"""The API server's work before scheduling: a request's prompt is tokenized and its blocks
hashed for the prefix cache before the engine sees it, so its queueing time grows with its
prompt (cached or not: the hashes are what find the cache), and every output token is
detokenized and streamed. The engine itself is a roofline with a per-request cost."""
CONSTANTS = {
    "base_us": {"start": 1500.0, "min": 0.0, "max": 20000.0},
    "c_compute": {"start": 1.7, "min": 1.0, "max": 100.0},
    "c_memory": {"start": 1.3, "min": 1.0, "max": 100.0},
    "per_req_us": {"start": 10.0, "min": 0.0, "max": 1000.0},
    "queue_us": {"start": 1500.0, "min": 0.0, "max": 15000.0},
    "hash_us_per_token": {"start": 2.5, "min": 0.0, "max": 100.0},
    "lag_steps": {"start": 1.1, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 120.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    compute = c.c_compute * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc)
    memory = c.c_memory * (f.weights + f.kv_read + f.kv_write)
    return c.base_us + max(compute, memory) + f.allreduce + c.per_req_us * f.n_req


def queueing_time(r, c):
    return c.queue_us + c.hash_us_per_token * r.input_tokens + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
