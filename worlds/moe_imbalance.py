"""MoE load imbalance: the router does not spread a step's tokens evenly, and an expert layer
waits for its busiest expert. With T tokens over the experts touched, the busiest holds the mean
plus a Poisson-like sqrt(mean) excess, so the GEMMs slow by 1 + imbalance * sqrt(experts / T):
most at small batches and for models with many experts (OLMoE's 64 with top-8 more than
Mixtral's 8 with top-2). Dense models (experts = 0) are untouched."""
CONSTANTS = {
    "base_us": {"start": 1500.0, "min": 0.0, "max": 20000.0},
    "c_compute": {"start": 1.6, "min": 1.0, "max": 100.0},
    "imbalance": {"start": 1.8, "min": 0.0, "max": 100.0},
    "c_memory": {"start": 1.3, "min": 1.0, "max": 100.0},
    "per_req_us": {"start": 15.0, "min": 0.0, "max": 1000.0},
    "queue_us": {"start": 2000.0, "min": 0.0, "max": 15000.0},
    "lag_steps": {"start": 1.2, "min": 0.0, "max": 4.0},
    "out_tok_us": {"start": 40.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    busiest = 1 + c.imbalance * sqrt(f.experts / f.tokens)
    compute = c.c_compute * ((f.gemm_pf + f.gemm_dc) * busiest + f.attn_pf + f.attn_dc)
    memory = c.c_memory * (f.weights + f.kv_read + f.kv_write)
    return c.base_us + max(compute, memory) + f.allreduce + c.per_req_us * f.n_req


def queueing_time(r, c):
    return c.queue_us + c.lag_steps * r.last_step_us


def output_token_time(c):
    return c.out_tok_us
