"""Attention kernels that change at a context length: up to 2048 tokens of context the decode
attention reads the KV cache with a single-pass paged kernel (poor bandwidth on short, ragged
blocks); above it a split-KV (flash-decoding) kernel reads it near peak but adds a reduction
kernel per layer. The step's largest context picks the kernel for the whole batch."""
CONSTANTS = {
    "base_us": {"start": 1600.0, "min": 0.0, "max": 20000.0},
    "c_compute": {"start": 1.7, "min": 1.0, "max": 100.0},
    "c_weights": {"start": 1.25, "min": 1.0, "max": 100.0},
    "kv_short": {"start": 2.4, "min": 1.0, "max": 100.0},
    "kv_long": {"start": 1.1, "min": 1.0, "max": 100.0},
    "reduce_us": {"start": 14.0, "min": 0.0, "max": 1000.0},
    "queue_us": {"start": 1800.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.3, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 45.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    kv = f.kv_read * (c.kv_long if f.ctx_max > 2048 else c.kv_short)
    reduction = c.reduce_us * f.layers if f.ctx_max > 2048 else 0
    compute = c.c_compute * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc)
    memory = c.c_weights * (f.weights + f.kv_write) + kv
    return c.base_us + max(compute, memory) + reduction + f.allreduce


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
