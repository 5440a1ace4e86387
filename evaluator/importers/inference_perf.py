"""inference-perf's per_request_lifecycle_metrics.json as measured requests (client-side).

A JSON list, one object per request: start_time and end_time (seconds, the client's clock),
info (input_tokens, output_tokens, output_token_times; newer versions nest them as
info.request_metrics.text.input_tokens and info.response_metrics.{output_tokens,
output_token_times}: both are read) and error (null, or {error_type, error_msg} for a failed
request). Arrival = start_time (the send time), TTFT = first output token time - start_time,
E2E = end_time - start_time. A failed request lasted end_time - start_time. A successful request
without token times is accepted only with 0 output tokens (its first token is its end).
inference-perf records no prefix groups: the importer writes none.
"""

from __future__ import annotations

import math
from pathlib import Path

from stepml_evolve.evaluator.errors import shown
from stepml_evolve.evaluator.importers.common import DataImportError, Measured
from stepml_evolve.evaluator.readers import read_json


def _num(v):
    """A finite number (an int too large for a float is not)."""
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:
        return False


def read_inference_perf(src: str | Path) -> Measured:
    src = Path(src)
    data = read_json(src, DataImportError)
    if not isinstance(data, list):
        raise DataImportError(
            f"{src}: expected a JSON list of per-request records (per_request_lifecycle_metrics.json)"
        )
    m = Measured(source="inference-perf", path=src, measurement="client")
    for k, rec in enumerate(data, start=1):

        def bad(problem, k=k):
            raise DataImportError(f"{src}: request {k}: {problem}")

        if not isinstance(rec, dict):
            bad("not an object")
        for key in ("start_time", "end_time", "info"):
            if key not in rec:
                bad(f"no {key}")
        start, end, info = rec["start_time"], rec["end_time"], rec["info"]
        if not (_num(start) and _num(end)):
            bad("start_time and end_time must be numbers (seconds)")
        if not isinstance(info, dict):
            bad("info is not an object")
        req_m = info.get("request_metrics") if isinstance(info.get("request_metrics"), dict) else {}
        resp_m = info.get("response_metrics") if isinstance(info.get("response_metrics"), dict) else {}
        text = req_m.get("text") if isinstance(req_m.get("text"), dict) else {}
        inp = info.get("input_tokens", text.get("input_tokens"))
        out = info.get("output_tokens", resp_m.get("output_tokens", 0))
        times = info.get("output_token_times", resp_m.get("output_token_times")) or []
        for name, v in (("input_tokens", inp), ("output_tokens", out)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                bad(f"info.{name} must be a non-negative integer, got {shown(v)}")
        if not isinstance(times, list) or not all(_num(t) for t in times):
            bad("info.output_token_times must be a list of numbers")
        if end < start:
            bad(f"end_time {end} precedes start_time {start}")
        failed = rec.get("error") not in (None, {}, "")
        if failed:
            if end <= start:
                bad("a failed request with no duration (end_time = start_time)")
            m.add(start * 1e6, inp, out, True, end - start)
            continue
        if end == start:
            bad("end_time equals start_time (no end-to-end latency)")
        if times:
            if times[0] < start:
                bad(f"the first output token time {times[0]} precedes start_time {start}")
            if any(b < a for a, b in zip(times, times[1:])):
                bad("output_token_times are not in order")
            if times[-1] > end:
                bad(f"the last output token time {times[-1]} is after end_time {end}")
            ttft = times[0] - start
        elif out == 0:
            ttft = end - start
        else:
            bad("a successful request with output tokens but no output_token_times (TTFT needs a streamed run)")
        if inp == 0:
            bad("a successful request with no input tokens")
        m.add(start * 1e6, inp, out, False, end - start, ttft)
    if not m.arrival_us:
        raise DataImportError(f"{src}: no requests")
    return m
