"""CUDA graphs: a decode-only step replays a graph captured for the next batch size up (1, 2, 4,
..., 512), so its GEMMs compute the padded rows too, and its kernels launch as one graph; a step
with a prefill chunk runs eagerly and launches every layer's kernels from the CPU. Above 512
decodes the step runs eagerly too (vLLM's largest capture size)."""
CONSTANTS = {
    "graph_us": {"start": 600.0, "min": 0.0, "max": 20000.0},
    "eager_us": {"start": 1200.0, "min": 0.0, "max": 20000.0},
    "launch_us": {"start": 55.0, "min": 0.0, "max": 1000.0},
    "c_compute": {"start": 1.7, "min": 1.0, "max": 100.0},
    "c_memory": {"start": 1.3, "min": 1.0, "max": 100.0},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.2, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 35.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    n = f.n_dc
    padded = 1 if n <= 1 else (2 if n <= 2 else (4 if n <= 4 else (8 if n <= 8 else (16 if n <= 16 else (32 if n <= 32 else (64 if n <= 64 else (128 if n <= 128 else (256 if n <= 256 else (512 if n <= 512 else n)))))))))
    memory = c.c_memory * (f.weights + f.kv_read + f.kv_write)
    graph = c.graph_us + max(c.c_compute * (f.gemm_dc * padded / n + f.attn_dc), memory)
    eager = c.eager_us + c.launch_us * f.layers + max(c.c_compute * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc), memory)
    step = graph if f.tok_pf < 1 and n <= 512 else eager
    return step + f.allreduce


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
