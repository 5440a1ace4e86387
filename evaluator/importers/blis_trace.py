"""BLIS trace v2 (`blis observe`, `evolve data export --blis-trace`) as measured requests.

Definition: BLIS sim/workload/tracev2.go. SRC is the header YAML; the data is the CSV beside it
with the same stem (or --trace-data). What is accepted:
  * trace_version 2, and 3 (version 3 only adds the header block goodput_slo_targets, which is
    ignored; the CSV is the same). Any other version is refused.
  * mode real only: generated (blis run) and replayed (blis replay) traces carry simulated
    times, not measurements.
  * columns are found by the names in the CSV's header row, so the optional columns BLIS detects
    by name (vllm_priority after slo_class, slo_target_us after deadline_us, x_request_id,
    adapter, think_time_us at the end) and older layouts both read right. Required:
    input_tokens, output_tokens, arrival_time_us, first_chunk_time_us, last_chunk_time_us,
    status. Optional: send_time_us (else the arrival), deadline_us, prefix_group and
    prefix_length; the rest (client/tenant/session ids, text/image/audio/video_tokens,
    reason_ratio, model, server_input_tokens, num_chunks, error_message, finish_reason) is not
    needed. The older 22-column trace (the 27 columns without text_tokens, image_tokens,
    audio_tokens, video_tokens and reason_ratio) is therefore accepted as is.
Timings (client-side): arrival = send_time_us if > 0 else arrival_time_us; TTFT = first chunk -
arrival; E2E = last chunk - arrival. Status ok = success; timeout/error = failed, whose duration
(how long it held its seat) is deadline_us - arrival for a timeout (else the last chunk), the last
chunk (else the deadline) for an error. The client's limit is deadline_us - arrival of the
successful requests (their smallest). A request in a prefix group has the prompt prefix_length +
input_tokens.
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

from stepml_evolve.evaluator.errors import shown
from stepml_evolve.evaluator.importers.blis_trace_export import TRACE_COLUMNS
from stepml_evolve.evaluator.importers.common import DataImportError, Measured
from stepml_evolve.evaluator.readers import DATA_BYTES, FileProblem, open_text, read_yaml

REQUIRED = ("input_tokens", "output_tokens", "arrival_time_us", "first_chunk_time_us", "last_chunk_time_us", "status")
INT_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "arrival_time_us",
    "send_time_us",
    "first_chunk_time_us",
    "last_chunk_time_us",
    "deadline_us",
    "prefix_length",
)
# the columns BLIS detects by name beyond tracev2.go's 27 (TRACE_COLUMNS); a header wider than both is no trace
OPTIONAL_COLUMNS = ("vllm_priority", "slo_target_us", "x_request_id", "adapter", "think_time_us")
MAX_COLUMNS = len(TRACE_COLUMNS) + len(OPTIONAL_COLUMNS)
VERSIONS = (2, 3)
STATUSES = ("ok", "timeout", "error")


def read_header(src: Path) -> dict:
    header = read_yaml(src, DataImportError, "trace header")
    if not isinstance(header, dict) or "trace_version" not in header:
        raise DataImportError(f"{src}: not a BLIS trace header (no trace_version)")
    v = header["trace_version"]
    if v not in VERSIONS:
        raise DataImportError(f"{src}: trace_version {v!r} is not supported (2 and 3 are)")
    mode = header.get("mode")
    if mode != "real":
        raise DataImportError(
            f"{src}: mode is {mode!r}, not 'real': only a trace of a real server (blis observe) carries measurements"
        )
    unit = header.get("time_unit", "microseconds")
    if unit not in ("microseconds", "us"):
        raise DataImportError(f"{src}: time_unit {unit!r} is not supported (microseconds)")
    return header


def recorded_deployment(header: dict) -> dict:
    server = header.get("server") or {}
    if not isinstance(server, dict):
        return {}
    out = {
        "model": server.get("model") or None,
        "tp": server.get("tensor_parallel") or None,
        "max_num_seqs": server.get("max_num_seqs") or None,
        "block_size": server.get("block_size") or None,
        "max_model_len": server.get("max_model_len") or None,
    }
    return {k: v for k, v in out.items() if v is not None}


def read_blis_trace(src: str | Path, trace_data: str | Path | None = None) -> Measured:
    src = Path(src)
    header = read_header(src)
    data = Path(trace_data) if trace_data else src.with_suffix(".csv")
    m = Measured(source="blis-trace", path=data, measurement="client", recorded=recorded_deployment(header))
    if not data.exists():
        raise DataImportError(f"{data}: no such trace data (the CSV beside {src.name}, or --trace-data)")
    try:
        fh = open_text(data, DATA_BYTES)
    except FileProblem as e:
        raise DataImportError(f"{data}: {e}") from None
    limits = []
    with fh:
        reader = csv.reader(fh)
        try:
            names = [c.strip() for c in next(reader)]
        except StopIteration:
            raise DataImportError(f"{data}: empty file (no header row)") from None
        except (csv.Error, UnicodeDecodeError) as e:
            raise DataImportError(f"{data}: header row: malformed CSV ({e})") from None
        if len(names) > MAX_COLUMNS:  # answered at the header, whatever its width (one pass over it)
            raise DataImportError(
                f"{data}: header row has {len(names):,} columns, expected at most {MAX_COLUMNS} "
                f"(a BLIS trace v2 has {len(TRACE_COLUMNS)}, and up to {len(OPTIONAL_COLUMNS)} optional ones)"
            )
        dup = sorted(c for c, k in Counter(names).items() if k > 1)
        if dup:
            raise DataImportError(f"{data}: header row names the column {shown(dup[0])} twice")
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise DataImportError(
                f"{data}: header row lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
            )
        col = {c: i for i, c in enumerate(names)}
        row_no = 0
        try:
            for row_no, row in enumerate(reader, start=1):
                if not row:
                    continue
                m_row = _parse_row(data, row_no, row, col, len(names))
                if m_row is None:
                    continue
                *fields, limit = m_row
                m.add(*fields)
                if limit is not None:
                    limits.append(limit)
        except (csv.Error, UnicodeDecodeError) as e:
            raise DataImportError(f"{data}: row {row_no + 1}: malformed CSV ({e})") from None
    if not m.arrival_us:
        raise DataImportError(f"{data}: no data rows")
    if not any(not f for f in m.failed):
        raise DataImportError(f"{data}: no successful request (status ok): nothing to compare a replay against")
    if limits:
        m.client_timeout_s = min(limits) / 1e6
    return m


def _parse_row(data: Path, k: int, row: list[str], col: dict, width: int):
    def bad(problem):
        raise DataImportError(f"{data}: row {k}: {problem}")

    if len(row) < width:
        bad(f"has {len(row)} columns, the header row has {width}")
    v = {}
    for c in INT_COLUMNS:
        if c not in col:
            v[c] = 0
            continue
        text = row[col[c]].strip()
        try:
            v[c] = int(text) if text else 0
        except ValueError:
            bad(f"{c} {shown(text)} is not an integer")
        if v[c] < 0:
            bad(f"{c} is negative ({v[c]})")
    status = row[col["status"]].strip().lower()
    if status not in STATUSES:
        bad(f"status {shown(status)} is not one of {', '.join(STATUSES)}")
    group = row[col["prefix_group"]].strip() if "prefix_group" in col else ""
    plen = v["prefix_length"]
    if group and plen <= 0:
        bad(f"prefix_group {shown(group)} without a positive prefix_length")
    prompt = v["input_tokens"] + (plen if group else 0)
    arrival = v["send_time_us"] if v["send_time_us"] > 0 else v["arrival_time_us"]
    first, last, deadline = v["first_chunk_time_us"], v["last_chunk_time_us"], v["deadline_us"]
    if deadline and deadline < arrival:
        bad(f"deadline_us {deadline} precedes the arrival {arrival}")
    if status == "ok":
        if first <= 0 or last <= 0:
            bad("status ok without first_chunk_time_us and last_chunk_time_us")
        if first < arrival:
            bad(f"first_chunk_time_us {first} precedes the send time {arrival}")
        if last < first:
            bad(f"last_chunk_time_us {last} precedes first_chunk_time_us {first}")
        if last == arrival:
            bad("last_chunk_time_us equals the send time (no end-to-end latency)")
        if prompt <= 0:
            bad("a successful request with no input tokens")
        limit = deadline - arrival if deadline > 0 else None
        return (
            arrival,
            prompt,
            v["output_tokens"],
            False,
            (last - arrival) / 1e6,
            (first - arrival) / 1e6,
            group,
            plen,
            limit,
        )
    if last and first and last < first:
        bad(f"last_chunk_time_us {last} precedes first_chunk_time_us {first}")
    if (first and first < arrival) or (last and last < arrival):
        bad("a chunk time precedes the send time")
    ends = [deadline, last] if status == "timeout" else [last, deadline]
    end = next((t for t in ends if t > arrival), None)
    if end is None:
        bad(f"a failed request ({status}) without deadline_us or chunk times: how long it lasted is unknown")
    return arrival, prompt, v["output_tokens"], True, (end - arrival) / 1e6, None, group, plen if group else 0, None
