"""CPU launch bound: the CPU prepares the batch and launches every layer's kernels while the GPU
runs the previous ones, so a step takes the longer of the two: the GPU's roofline time or the
CPU's (a fixed part, a part per layer of kernel launches, a part per scheduled request). Small
models and small batches are CPU-bound, large ones GPU-bound."""
CONSTANTS = {
    "cpu_us": {"start": 900.0, "min": 0.0, "max": 20000.0},
    "launch_us": {"start": 70.0, "min": 0.0, "max": 1000.0},
    "cpu_per_req_us": {"start": 22.0, "min": 0.0, "max": 1000.0},
    "gpu_us": {"start": 300.0, "min": 0.0, "max": 20000.0},
    "c_compute": {"start": 1.7, "min": 1.0, "max": 100.0},
    "c_memory": {"start": 1.3, "min": 1.0, "max": 100.0},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.2, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 40.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    gpu = c.gpu_us + max(c.c_compute * (f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc), c.c_memory * (f.weights + f.kv_read + f.kv_write)) + f.allreduce
    cpu = c.cpu_us + c.launch_us * f.layers + c.cpu_per_req_us * f.n_req
    return max(gpu, cpu)


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
