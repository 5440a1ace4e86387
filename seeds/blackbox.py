"""Blackbox regression (BLIS's default): a base cost plus per-token prefill and decode costs."""
CONSTANTS = {
    "beta0_us": 6000.0,
    "beta1_us_per_prefill_token": 15.0,
    "beta2_us_per_decode_token": 30.0,
    "alpha0_us": 2000.0,
    "alpha1_us_per_input_token": 1.0,
    "alpha2_us_per_output_token": 50.0,
}


def step_time(f, c):
    return c.beta0_us + c.beta1_us_per_prefill_token * f.tok_pf + c.beta2_us_per_decode_token * f.n_dc


def queueing_time(r, c):
    return c.alpha0_us + c.alpha1_us_per_input_token * r.input_tokens


def output_token_time(c):
    return c.alpha2_us_per_output_token
