"""Phase-decomposed: prefill chunks pay compute, decode pays the larger of compute and memory,
with per-request and base overheads."""
CONSTANTS = {
    "base_us": 1500.0,
    "c_prefill": 2.0,
    "c_decode_compute": 2.0,
    "c_decode_memory": 1.3,
    "per_request_us": 20.0,
    "c_comm": 1.0,
    "queue_us": 2000.0,
    "out_tok_us": 50.0,
}


def step_time(f, c):
    prefill = c.c_prefill * (f.gemm_pf + f.attn_pf)
    decode = max(c.c_decode_compute * (f.gemm_dc + f.attn_dc), c.c_decode_memory * (f.weights + f.kv_read))
    return c.base_us + prefill + decode + c.per_request_us * f.n_req + c.c_comm * f.allreduce


def queueing_time(r, c):
    return c.queue_us


def output_token_time(c):
    return c.out_tok_us
