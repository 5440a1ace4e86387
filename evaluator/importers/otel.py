"""vLLM's OpenTelemetry `llm_request` spans (OTLP JSON, one export request per line) as measured
requests (server-side).

Shape: {"resourceSpans": [{"scopeSpans": [{"spans": [{name, startTimeUnixNano, endTimeUnixNano,
attributes: [{key, value: {stringValue|intValue|doubleValue}}], status: {code}}]}]}]}, intValue
possibly a string (OTLP JSON writes 64-bit integers as strings). Only spans named llm_request are
read. vLLM starts the span at the request's arrival at the server; its attributes
gen_ai.usage.prompt_tokens, gen_ai.usage.completion_tokens, gen_ai.latency.time_to_first_token and
gen_ai.latency.e2e (seconds, from that arrival) and gen_ai.request.id (optional,
gen_ai.latency.time_in_queue is informative) give the request. Arrival = span start, TTFT and E2E
as the attributes say. A span with status code 2 (ERROR) is a failed request lasting its e2e (or
the span's duration). vLLM records no prefix groups and no client limit.
"""

from __future__ import annotations

import math
from pathlib import Path

from stepml_evolve.evaluator.errors import cut, shown
from stepml_evolve.evaluator.importers.common import DataImportError, Measured
from stepml_evolve.evaluator.readers import DATA_BYTES, FileProblem, parse_json, read_text

SPAN = "llm_request"
PROMPT, COMPLETION = "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"
TTFT, E2E, QUEUE, REQUEST_ID = (
    "gen_ai.latency.time_to_first_token",
    "gen_ai.latency.e2e",
    "gen_ai.latency.time_in_queue",
    "gen_ai.request.id",
)


def _value(v):
    if not isinstance(v, dict):
        return None
    for key in ("intValue", "doubleValue", "stringValue", "boolValue"):
        if key in v:
            x = v[key]
            if key == "intValue":
                try:
                    return int(x)
                except (TypeError, ValueError, OverflowError):  # not a number, over INT_DIGITS digits, inf
                    return None
            return x
    return None


def _number(v) -> bool:
    """A finite number (an int too large for a float is not)."""
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:
        return False


def _spans(doc):
    for rs in doc.get("resourceSpans") or []:
        for ss in (rs or {}).get("scopeSpans") or (rs or {}).get("instrumentationLibrarySpans") or []:
            yield from (ss or {}).get("spans") or []


def read_otel(src: str | Path) -> Measured:
    src = Path(src)
    lines = read_text(src, DataImportError, limit=DATA_BYTES).splitlines()
    m = Measured(source="otel", path=src, measurement="server")
    seen = set()
    for ln, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            doc = parse_json(line)
        except FileProblem as e:
            raise DataImportError(f"{src}: line {ln}: {e}") from None
        if not isinstance(doc, dict) or "resourceSpans" not in doc:
            raise DataImportError(f"{src}: line {ln}: not an OTLP JSON export (no resourceSpans)")
        try:
            spans = list(_spans(doc))
        except (AttributeError, TypeError):
            raise DataImportError(f"{src}: line {ln}: malformed resourceSpans/scopeSpans/spans") from None
        for span in spans:
            if not isinstance(span, dict) or span.get("name") != SPAN:
                continue
            listed = span.get("attributes") or []
            attrs = {
                a.get("key"): _value(a.get("value"))
                for a in (listed if isinstance(listed, list) else [])
                if isinstance(a, dict) and isinstance(a.get("key"), str)
            }
            rid = attrs.get(REQUEST_ID) or span.get("spanId") or f"#{len(m.arrival_us) + 1}"
            rid = rid if isinstance(rid, str) else shown(rid)  # an id of another type still names the span

            def bad(problem, ln=ln, rid=rid):
                raise DataImportError(f"{src}: line {ln}: span of request {cut(rid)}: {problem}")

            if not isinstance(listed, list):
                bad(f"attributes must be a list, got {shown(listed)}")

            if rid in seen:
                bad("appears twice")
            seen.add(rid)
            try:
                start = int(span["startTimeUnixNano"])
            except (KeyError, TypeError, ValueError, OverflowError):
                bad("no startTimeUnixNano (an integer of nanoseconds)")
            try:
                end = int(span.get("endTimeUnixNano") or 0)
            except (TypeError, ValueError, OverflowError):
                end = 0
            prompt, completion = attrs.get(PROMPT), attrs.get(COMPLETION, 0)
            for name, v in ((PROMPT, prompt), (COMPLETION, completion)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    bad(f"attribute {name} must be a non-negative integer, got {shown(v)}")
            e2e, ttft = attrs.get(E2E), attrs.get(TTFT)
            status = span.get("status") or {}
            failed = isinstance(status, dict) and status.get("code") in (2, "STATUS_CODE_ERROR")
            if e2e is None and end > start:
                e2e = (end - start) / 1e9
            if not _number(e2e) or e2e <= 0:
                bad(f"attribute {E2E} must be a positive number of seconds, got {shown(e2e)}")
            if failed:
                m.add(start / 1e3, prompt, completion, True, e2e)
                continue
            if not _number(ttft) or ttft < 0:
                bad(f"attribute {TTFT} must be a non-negative number of seconds, got {shown(ttft)}")
            if ttft > e2e:
                bad(f"{TTFT} {ttft} is greater than {E2E} {e2e}")
            if prompt == 0:
                bad("a successful request with no prompt tokens")
            m.add(start / 1e3, prompt, completion, False, e2e, ttft)
    if not m.arrival_us:
        raise DataImportError(f"{src}: no {SPAN} spans")
    return m
