"""Blackbox regression (BLIS's default): a base cost plus per-token prefill and decode costs."""
# Bounds (the fit keeps every constant inside them): the coefficients are a regression's, not
# multipliers of peak-rate times, so physics only says they are costs: all >= 0. The request
# terms are per-request delays the real data bound (../shared/data/replay): every TTFT contains
# alpha0_us + alpha1 * input_tokens + alpha2; the fastest TTFT of any request is 15.8 ms, so
# alpha0_us <= 15000, and the smallest TTFT per input token of any request is 24.3 us
# (Llama-2-7B roleplay), so alpha1 <= 24; every later token costs a step plus alpha2 and the
# fastest mean inter-token time of any request is 6.16 ms, so alpha2 <= 6000.
# Priors: seeds/priors.yaml gives each constant's, with its source (docs/concepts/priors.md). The fit adds
# z^2 loss points for a constant z spreads from its prior's centre, so what the data cannot decide
# (prefill compute, on prompts the prefix cache served) stays where physics puts it. Each start is
# its prior's centre. No physics: it reads no FLOP or byte time, so it is below the physical floor
# and `--physics check` refuses it; fit it with `--physics off`, one model at a time, as BLIS does.
CONSTANTS = {
    "beta0_us": {"start": 6000.0, "min": 0.0, "prior": 6000.0, "spread": 1.5},
    "beta1_us_per_prefill_token": {"start": 15.0, "min": 0.0, "prior": 15.0, "spread": 1.5},
    "beta2_us_per_decode_token": {"start": 30.0, "min": 0.0, "prior": 30.0, "spread": 1.5},
    "alpha0_us": {"start": 2000.0, "min": 0.0, "max": 15000.0, "prior": 2000.0, "spread": 1.5},
    "alpha1_us_per_input_token": {"start": 1.0, "min": 0.0, "max": 24.0, "prior": 1.0, "spread": 1.5},
    "alpha2_us_per_output_token": {"start": 50.0, "min": 0.0, "max": 6000.0, "prior": 50.0, "spread": 1.5},
}


def step_time(f, c):
    return c.beta0_us + c.beta1_us_per_prefill_token * f.tok_pf + c.beta2_us_per_decode_token * f.n_dc


def queueing_time(r, c):
    return c.alpha0_us + c.alpha1_us_per_input_token * r.input_tokens


def output_token_time(c):
    return c.alpha2_us_per_output_token
