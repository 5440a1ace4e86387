"""Blackbox regression (BLIS's default): a base cost plus per-token prefill and decode costs."""
# Bounds (the fit keeps every constant inside them): the coefficients are a regression's, not
# multipliers of peak-rate times, so physics only says they are costs: all >= 0. The request
# terms are per-request delays the real data bound (../shared/data/replay): every TTFT contains
# alpha0_us + alpha1 * input_tokens + alpha2; the fastest TTFT of any request is 15.8 ms, so
# alpha0_us <= 15000, and the smallest TTFT per input token of any request is 24.3 us
# (Llama-2-7B roleplay), so alpha1 <= 24; every later token costs a step plus alpha2 and the
# fastest mean inter-token time of any request is 6.16 ms, so alpha2 <= 6000.
CONSTANTS = {
    "beta0_us": {"start": 6000.0, "min": 0.0},
    "beta1_us_per_prefill_token": {"start": 15.0, "min": 0.0},
    "beta2_us_per_decode_token": {"start": 30.0, "min": 0.0},
    "alpha0_us": {"start": 2000.0, "min": 0.0, "max": 15000.0},
    "alpha1_us_per_input_token": {"start": 1.0, "min": 0.0, "max": 24.0},
    "alpha2_us_per_output_token": {"start": 50.0, "min": 0.0, "max": 6000.0},
}


def step_time(f, c):
    return c.beta0_us + c.beta1_us_per_prefill_token * f.tok_pf + c.beta2_us_per_decode_token * f.n_dc


def queueing_time(r, c):
    return c.alpha0_us + c.alpha1_us_per_input_token * r.input_tokens


def output_token_time(c):
    return c.alpha2_us_per_output_token
