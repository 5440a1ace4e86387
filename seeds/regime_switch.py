"""Regime switch: above a prefill-token threshold the step is compute-bound, below it
memory-bound; each regime has its own scale."""
CONSTANTS = {
    "base_us": 2000.0,
    "switch_tokens": 256.0,
    "c_compute": 2.0,
    "c_memory": 1.3,
    "c_light_compute": 1.0,
    "queue_us": 2000.0,
    "out_tok_us": 50.0,
}


def step_time(f, c):
    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc
    memory = f.weights + f.kv_read + f.kv_write
    heavy = c.c_compute * compute + 0.5 * c.c_memory * memory
    light = c.c_memory * memory + c.c_light_compute * compute
    return c.base_us + f.allreduce + (heavy if f.tok_pf > c.switch_tokens else light)


def queueing_time(r, c):
    return c.queue_us


def output_token_time(c):
    return c.out_tok_us
