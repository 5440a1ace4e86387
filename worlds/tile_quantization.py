"""Tile quantization: GEMMs run on 128-row tiles, so a step's GEMM efficiency rises with its
tokens and saturates (a step of 16 decode tokens fills an eighth of a tile and pays for all of it).
Efficiency is tokens / (tokens + tile_tokens), the smooth form of tokens / (128 * ceil(tokens / 128)).
Attention and memory traffic run at fixed efficiencies, compute and memory overlap (roofline)."""
CONSTANTS = {
    "base_us": {"start": 1400.0, "min": 0.0, "max": 20000.0},
    "c_gemm": {"start": 1.5, "min": 1.0, "max": 100.0},
    "tile_tokens": {"start": 96.0, "min": 0.0, "max": 4096.0},
    "c_attn": {"start": 2.2, "min": 1.0, "max": 100.0},
    "c_memory": {"start": 1.3, "min": 1.0, "max": 100.0},
    "queue_us": {"start": 2200.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.0, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 40.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    gemm = c.c_gemm * (f.gemm_pf + f.gemm_dc) * (1 + c.tile_tokens / f.tokens)
    compute = gemm + c.c_attn * (f.attn_pf + f.attn_dc)
    memory = c.c_memory * (f.weights + f.kv_read + f.kv_write)
    return c.base_us + max(compute, memory) + f.allreduce


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
