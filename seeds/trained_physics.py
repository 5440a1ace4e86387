"""Trained-physics basis (as in BLIS): a linear sum of separate prefill and decode compute
terms, weight reads, KV traffic, all-reduce, per-layer and per-request overheads and a constant."""
CONSTANTS = {
    "beta_pf_gemm": 1.5,
    "beta_pf_attn": 1.5,
    "beta_dc_gemm": 1.5,
    "beta_dc_attn": 1.5,
    "beta_weights": 1.2,
    "beta_kv": 1.2,
    "beta_allreduce": 1.0,
    "per_layer_us": 30.0,
    "per_request_us": 10.0,
    "base_us": 500.0,
    "queue_us": 2000.0,
    "out_tok_us": 50.0,
}


def step_time(f, c):
    compute = c.beta_pf_gemm * f.gemm_pf + c.beta_pf_attn * f.attn_pf + c.beta_dc_gemm * f.gemm_dc + c.beta_dc_attn * f.attn_dc
    memory = c.beta_weights * f.weights + c.beta_kv * (f.kv_read + f.kv_write)
    overhead = c.per_layer_us * f.layers + c.per_request_us * f.n_req + c.base_us
    return compute + memory + c.beta_allreduce * f.allreduce + overhead


def queueing_time(r, c):
    return c.queue_us


def output_token_time(c):
    return c.out_tok_us
