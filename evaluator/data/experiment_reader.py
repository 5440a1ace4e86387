"""Reading one experiment directory (../shared/data/README.md): every file and field checked against
the bounds of experiments.py, in one-line errors naming the experiment, file and field; the caveats
handled as `LoadOptions` says (experiments.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.data.experiments import (
    DEFAULT_CLIENT_TIMEOUT_S,
    MAX_BLOCK_SIZE,
    MAX_BLOCK_SLOTS,
    MAX_KV_BLOCKS,
    MAX_REQUESTS,
    MAX_SEQS,
    MAX_TIME_S,
    MAX_TIME_US,
    MAX_TOKENS,
    MAX_TP,
    MEASUREMENTS,
    Experiment,
    ExperimentError,
    LoadOptions,
    ServerConfig,
    _temporal_split,
)
from stepml_evolve.evaluator.data.prompt_reuse import (
    ReuseReport,
    Sharing,
    assign_prompts,
    cycle_sharing,
    detect_cycle,
    expected_cached_share,
    prefix_groups,
)
from stepml_evolve.evaluator.errors import shown
from stepml_evolve.evaluator.hardware.hardware import DEFAULT_HARDWARE, get_hardware
from stepml_evolve.evaluator.hardware.model_arch import ModelArch
from stepml_evolve.evaluator.readers import CONFIG_BYTES, DATA_BYTES, FileProblem, file_text, parse_json


def _read_json(exp: str, path: Path, limit: int):
    if not path.exists() and not path.is_symlink():
        raise ExperimentError(exp, f"missing file {path.name}")
    try:
        return parse_json(file_text(path, limit))
    except FileProblem as e:
        raise ExperimentError(exp, f"{path.name}: {e}") from None


def _int_field(exp: str, where: str, value, lo: int, hi: int) -> int:
    """`value` if it is an integer (not a bool, a float or a string) in lo..hi; else an error
    naming `where` (file: field)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ExperimentError(exp, f"{where} must be an integer in {lo:,}..{hi:,}, not {shown(value)}")
    return value


def _optional_int(exp: str, where: str, value, lo: int, hi: int) -> int | None:
    return None if value is None else _int_field(exp, where, value, lo, hi)


def _seconds_field(exp: str, where: str, value, positive: bool) -> float:
    """`value` if it is a number of seconds (an int or a float, never a string or a bool), finite,
    positive (or non-negative) and at most MAX_TIME_S; else an error naming `where`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not (value > 0 if positive else value >= 0)
        or value > MAX_TIME_S
    ):
        low = "0 <" if positive else "0 <="
        raise ExperimentError(
            exp, f"{where} must be a number of seconds, {low} s <= {MAX_TIME_S:.0e}, not {shown(value)}"
        )
    return float(value)


def _config_int(exp: str, cfg: dict, key: str, hi: int) -> int:
    return _int_field(exp, f"requests.json: config.{key}", cfg.get(key), 1, hi)


def _check_deployment(exp: str, arch: ModelArch, tp: int, server: ServerConfig) -> None:
    """A deployment no server runs: a tensor parallelism that does not divide the model's
    attention heads (vLLM refuses it: each GPU takes a whole share of them), and a step budget
    under one KV block (a budget of 1 token replays a 600-token prompt in 600 steps). vLLM's own
    floor, a budget of at least max_num_seqs, is not the rule: the workloads grid of the
    known-truth worlds runs chunked prefill at its smallest, 64 tokens for 128 sequences."""
    if arch.heads % tp:
        raise ExperimentError(
            exp,
            f"requests.json: config.tensor_parallelism {tp} does not divide the model's {arch.heads} attention "
            "heads (model_config.num_heads): vLLM refuses such a deployment",
        )
    if server.max_num_batched_tokens < server.block_size:
        raise ExperimentError(
            exp,
            f"requests.json: config.max_num_batched_tokens {server.max_num_batched_tokens:,} is under one KV block "
            f"(config.block_size {server.block_size:,}): a step's token budget must hold at least one block",
        )


def _summary_means(path: Path) -> dict | None:
    """inference-perf's success means, or None when the file is absent or unusable."""
    if not path.is_file():
        return None
    try:
        lat = parse_json(file_text(path, CONFIG_BYTES))["successes"]["latency"]
        return {
            "e2e_mean_s": float(lat["request_latency"]["mean"]),
            "ttft_mean_s": float(lat["time_to_first_token"]["mean"]),
        }
    except (FileProblem, KeyError, TypeError, ValueError):
        return None


def load_experiment(path: str | Path, options: LoadOptions = LoadOptions()) -> Experiment:
    """Load and validate one experiment directory; raises ExperimentError (one line)."""
    path = Path(path)
    exp = path.name
    if not path.is_dir():
        raise ExperimentError(exp, "not a directory")
    meta, truth, profile = _read_files(exp, path, options)
    cfg = meta["config"]
    arch, tp, server, hardware = _deployment(exp, meta, options)
    reqs = meta["requests"]
    n = len(reqs)
    order, arrival, inputs, reported_out, failed, e2e, ttft = _requests_and_truth(exp, reqs, truth)
    ok = ~failed

    notes = []
    if (inputs[ok] <= 0).any():
        raise ExperimentError(exp, "requests.json: a successful request has input_tokens 0")
    shared = _shared_prefix(exp, profile)
    profile_out_len = _optional_int(
        exp, "profile.json: data.shared_prefix.output_len", shared.get("output_len"), 1, MAX_TOKENS
    )
    out_len_used = None
    if options.output_len == "profile" and profile_out_len is not None:
        out_len_used = profile_out_len
        output = np.full(n, out_len_used, dtype=np.int64)
    else:
        output = np.maximum(reported_out, 1)
        if options.output_len == "profile":
            notes.append("profile.json has no output_len: reported output_tokens used")

    sys_len = _first_count(
        exp,
        MAX_TOKENS,
        ("profile.json: data.shared_prefix.system_prompt_len", shared.get("system_prompt_len")),
        ("requests.json: config.system_prompt_len", cfg.get("system_prompt_len")),
    )
    n_system = _first_count(
        exp,
        MAX_REQUESTS,
        ("profile.json: data.shared_prefix.num_unique_system_prompts", shared.get("num_unique_system_prompts")),
        ("requests.json: config.numprefix_groups", cfg.get("numprefix_groups")),
    )
    recorded = _recorded_groups(exp, reqs, order, sys_len)
    inputs, sharing, reuse, imputed = _prompt_sharing(
        exp,
        options.prompt_reuse,
        recorded,
        inputs,
        failed & (inputs <= 0),
        sys_len,
        n_system,
        server.block_size,
        reqs,
        order,
        notes,
    )
    _check_block_slots(exp, inputs, output, server.block_size)

    measurement = meta.get("measurement", "client")
    if measurement not in MEASUREMENTS:
        raise ExperimentError(
            exp, f"requests.json: measurement must be one of {', '.join(MEASUREMENTS)}, not {measurement!r}"[:200]
        )
    timeout_s = _client_timeout(exp, cfg, options, failed, e2e)
    abort_after = np.where(failed, np.round(e2e * 1e6), timeout_s * 1e6).astype(np.int64)

    return Experiment(
        name=exp,
        model=str(meta.get("model_id") or meta.get("model_short") or "unknown"),
        workload=str(meta.get("profile") or ""),
        tp=tp,
        hardware=hardware,
        arch=arch,
        server=server,
        arrival_us=np.round(arrival).astype(np.int64),
        input_tokens=inputs,
        output_tokens=output,
        reported_output_tokens=reported_out,
        failed=failed,
        abort_after_us=abort_after,
        e2e_s=e2e,
        ttft_s=ttft,
        split=_temporal_split(n, options.split),
        source_split=str(meta.get("split") or ""),
        output_len_used=out_len_used,
        n_imputed_inputs=imputed,
        summary=_summary_means(path / "summary_lifecycle_metrics.json"),
        synthetic=bool(meta.get("synthetic", False)),
        notes=notes,
        prefix_group=sharing.group,
        group_tokens=sharing.group_tokens,
        prompt=sharing.prompt,
        recorded_groups=recorded is not None,
        measurement=measurement,
        prompt_reuse=reuse,
    )


def _read_files(exp: str, path: Path, options: LoadOptions) -> tuple[dict, list, dict]:
    """requests.json, ground_truth.json and profile.json (empty where it may be absent), each of
    the shape the rest reads."""
    meta = _read_json(exp, path / "requests.json", DATA_BYTES)
    truth = _read_json(exp, path / "ground_truth.json", DATA_BYTES)
    if (path / "profile.json").exists():
        profile = _read_json(exp, path / "profile.json", CONFIG_BYTES)
    elif options.output_len == "profile":
        # it holds the output length the server generated (EOS ignored) and the shared system
        # prompt behind the prefix-cache hits: without it the replay would be quietly wrong
        raise ExperimentError(
            exp,
            "missing file profile.json (needed for the output length and the shared "
            "prefix; --output-len reported uses the client's token counts instead)",
        )
    else:
        profile = {}
    if not isinstance(meta, dict) or not isinstance(meta.get("requests"), list):
        raise ExperimentError(exp, "requests.json: expected an object with a 'requests' list")
    if not isinstance(truth, list):
        raise ExperimentError(exp, "ground_truth.json: expected a list of per-request records")
    if not isinstance(meta.get("config"), dict):
        raise ExperimentError(exp, "requests.json: missing 'config' object")
    return meta, truth, profile


def _deployment(exp: str, meta: dict, options: LoadOptions):
    """The model's architecture, the TP degree, the server's limits and the hardware, checked."""
    cfg = meta["config"]
    try:
        arch = ModelArch.from_model_config(meta.get("model_config") or {})
    except ValueError as e:
        raise ExperimentError(exp, f"requests.json: {e}") from None
    tp = _config_int(exp, cfg, "tensor_parallelism", MAX_TP)
    server = ServerConfig(
        max_num_seqs=_config_int(exp, cfg, "max_num_seqs", MAX_SEQS),
        max_num_batched_tokens=_config_int(exp, cfg, "max_num_batched_tokens", MAX_TOKENS),
        kv_blocks=_config_int(exp, cfg, "kv_blocks_total_gpu", MAX_KV_BLOCKS),
        block_size=_config_int(exp, cfg, "block_size", MAX_BLOCK_SIZE),
    )
    _check_deployment(exp, arch, tp, server)
    hw_name = options.hardware or cfg.get("hardware") or meta.get("hardware") or DEFAULT_HARDWARE
    try:
        hardware = get_hardware(str(hw_name))
    except KeyError as e:
        raise ExperimentError(exp, e.args[0]) from None
    return arch, tp, server, hardware


def _requests_and_truth(exp: str, reqs: list, truth: list):
    """The requests' arrays and their measured latencies (matched by index, checked), in arrival
    order, with that order: (order, arrival, inputs, reported outputs, failed, e2e, ttft)."""
    n = len(reqs)
    if n == 0:
        raise ExperimentError(exp, "requests.json: no requests")
    if n > MAX_REQUESTS:
        raise ExperimentError(exp, f"requests.json: {n:,} requests, over the limit of {MAX_REQUESTS:,}")
    if len(truth) != n:
        raise ExperimentError(exp, f"ground_truth.json has {len(truth)} records but requests.json has {n} requests")
    try:
        _check_records(exp, "requests.json", reqs, REQUEST_INTS)
        index = np.array([r["index"] for r in reqs], dtype=np.int64)
        arrival = np.array([r["arrival_time_us"] for r in reqs], dtype=np.float64)
        inputs = np.array([r["input_tokens"] for r in reqs], dtype=np.int64)
        reported_out = np.array([r["output_tokens"] for r in reqs], dtype=np.int64)
        failed = np.array([bool(r.get("has_error", False)) for r in reqs])
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise ExperimentError(exp, f"requests.json: bad request record ({type(e).__name__}: {e})") from None
    try:
        _check_records(exp, "ground_truth.json", truth, TRUTH_INTS, TRUTH_SECONDS)
        truth_index = np.array([t["index"] for t in truth], dtype=np.int64)
        truth_failed = np.array([bool(t.get("has_error", False)) for t in truth])
        e2e = np.array([t.get("e2e_s", math.nan) for t in truth], dtype=np.float64)
        ttft = np.array([math.nan if t.get("ttft_s") is None else t["ttft_s"] for t in truth], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise ExperimentError(exp, f"ground_truth.json: bad record ({type(e).__name__}: {e})") from None

    if not np.isfinite(arrival).all():
        raise ExperimentError(exp, "requests.json: non-finite arrival_time_us")
    if (arrival < 0).any():
        i = int(np.argmax(arrival < 0))
        raise ExperimentError(exp, f"requests.json: negative arrival_time_us at request {int(index[i])}")
    # ground truth is matched to requests by index, not by position
    order_truth = np.argsort(truth_index, kind="stable")
    order_req = np.argsort(index, kind="stable")
    if not np.array_equal(truth_index[order_truth], index[order_req]) or len(np.unique(index)) != n:
        raise ExperimentError(exp, "ground_truth.json indices do not match requests.json indices")
    pos = np.empty(n, dtype=np.int64)
    pos[order_req] = order_truth  # truth record for each request position
    truth_failed, e2e, ttft = truth_failed[pos], e2e[pos], ttft[pos]
    if not np.array_equal(truth_failed, failed):
        i = int(np.argmax(truth_failed != failed))
        raise ExperimentError(
            exp, f"has_error differs between requests.json and ground_truth.json at request {int(index[i])}"
        )
    ok = ~failed
    if not np.isfinite(e2e).all() or (e2e <= 0).any():
        raise ExperimentError(exp, "ground_truth.json: missing or non-positive e2e_s")
    if not np.isfinite(ttft[ok]).all() or (ttft[ok] < 0).any():
        raise ExperimentError(exp, "ground_truth.json: a successful request lacks a valid ttft_s")
    if (ttft[ok] > e2e[ok] * (1 + 1e-9)).any():
        raise ExperimentError(exp, "ground_truth.json: ttft_s greater than e2e_s")
    if not ok.any():
        raise ExperimentError(exp, "no successful request to compare against")

    order = np.argsort(arrival, kind="stable")  # arrival order; the data is sorted already
    return (order, *(a[order] for a in (arrival, inputs, reported_out, failed, e2e, ttft)))


def _client_timeout(exp: str, cfg: dict, options: LoadOptions, failed: np.ndarray, e2e: np.ndarray) -> float:
    """The client's timeout in seconds: --client-timeout, else the experiment's config, else the
    fastest failed request's E2E, else the default."""
    cfg_timeout = cfg.get("client_timeout_s")
    if cfg_timeout is not None:
        _seconds_field(exp, "requests.json: config.client_timeout_s", cfg_timeout, positive=True)
    if options.client_timeout_s is not None:
        return options.client_timeout_s
    if cfg_timeout is not None:
        return float(cfg_timeout)
    if failed.any():
        return float(np.floor(e2e[failed].min()))
    return DEFAULT_CLIENT_TIMEOUT_S


def _prompt_sharing(
    exp: str,
    policy: str,
    recorded: tuple[np.ndarray, tuple[int, ...]] | None,
    inputs: np.ndarray,
    unknown: np.ndarray,
    sys_len: int,
    n_system: int,
    block: int,
    reqs: list,
    order: np.ndarray,
    notes: list[str],
) -> tuple[np.ndarray, Sharing, ReuseReport, int]:
    """The prompt structure under `policy` (prompt_reuse.py), the input lengths with the unknown ones
    (failed requests record none) filled in, and how many were filled."""
    n = len(inputs)
    inputs = inputs.copy()
    known = ~unknown
    cycle = detect_cycle(inputs, known) if policy == "detect" and recorded is None else None
    assignment = None
    if cycle is not None:
        assignment = assign_prompts(inputs, known, cycle.period)
        inputs = assignment.lengths
        if assignment.n_imputed:
            notes.append(
                f"{assignment.n_imputed} failed requests without input length: their prompt's length in the cycle"
            )
    rest = unknown & (inputs <= 0)
    if rest.any():
        inputs[rest] = int(np.median(inputs[known]))
        notes.append(f"{int(rest.sum())} failed requests without input length: median of successful used")
    imputed = int(unknown.sum())

    if policy == "off":
        sharing, report = Sharing.none(n), ReuseReport(policy, "none")
    elif recorded is not None:
        groups, lengths = recorded
        grouped = groups >= 0
        over = grouped & known & (inputs < np.array(lengths, dtype=np.int64)[np.maximum(groups, 0)])
        if over.any():
            i = int(np.flatnonzero(over)[0])
            rec = reqs[int(order[i])]
            raise ExperimentError(
                exp,
                f"requests.json: request {rec.get('index')} has prefix_length "
                f"{lengths[groups[i]]} of group {rec.get('prefix_group')!r} but only "
                f"{int(inputs[i])} input tokens"[:240],
            )
        short = grouped & ~known
        inputs[short] = np.maximum(inputs[short], np.array(lengths, dtype=np.int64)[groups[short]])
        sharing = Sharing(np.arange(n, dtype=np.int64), groups, lengths)
        report = ReuseReport(policy, "recorded", n_prompts=len(lengths))
    elif cycle is not None:
        sharing = cycle_sharing(assignment, cycle.period, sys_len if sys_len >= block else 0, n_system)
        report = ReuseReport(
            policy,
            "cycle",
            period=cycle.period,
            share_matched=round(cycle.share, 4),
            n_prompts=cycle.period,
            n_swapped=assignment.n_swapped,
            n_unmatched=assignment.n_unmatched,
            n_imputed=assignment.n_imputed,
        )
    else:
        note = "no cycle in the input lengths: system prompts only" if policy == "detect" else ""
        if sys_len >= block:
            groups = prefix_groups(inputs, sys_len, max(n_system, 1))
            sharing = Sharing(np.arange(n, dtype=np.int64), groups, (sys_len,) * max(n_system, 1))
            report = ReuseReport(policy, "system-prompt", n_prompts=max(n_system, 1), note=note)
        else:
            sharing = Sharing.none(n)
            report = ReuseReport(
                policy, "none", note=note + ("; " if note else "") + "no system prompt of a block or more"
            )
    report = dataclasses.replace(report, cached_share=round(expected_cached_share(inputs, sharing, block), 4))
    return inputs, sharing, report, imputed


def _recorded_groups(
    exp: str, reqs: list, order: np.ndarray, default_len: int
) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """The per-request prefix groups the data recorded (arrival order, numbered by first
    appearance) and each group's prefix length, or None when no request records a group.
    Two lengths inside one group are refused: the group's requests share one prefix."""
    names = [reqs[int(i)].get("prefix_group") for i in order]
    if not any(isinstance(g, str) and g for g in names):
        return None
    ids: dict[str, int] = {}
    lengths: list[int] = []
    groups = np.full(len(names), -1, dtype=np.int64)
    for pos, g in enumerate(names):
        if g is None or g == "":
            continue
        if not isinstance(g, str):
            raise ExperimentError(exp, f"requests.json: prefix_group must be a string, not {g!r}"[:200])
        rec = reqs[int(order[pos])]
        length = rec.get("prefix_length", default_len)
        if isinstance(length, bool) or not isinstance(length, int) or not 0 < length <= MAX_TOKENS:
            raise ExperimentError(
                exp,
                f"requests.json: request {rec.get('index')} has prefix group {g!r} but no "
                f"positive prefix_length (nor a profile system_prompt_len)"[:240],
            )
        k = ids.setdefault(g, len(ids))
        if k == len(lengths):
            lengths.append(length)
        elif lengths[k] != length:
            raise ExperimentError(
                exp,
                f"requests.json: request {rec.get('index')} has prefix_length {length} but "
                f"group {g!r} started with {lengths[k]} (one group, one shared prefix)"[:240],
            )
        groups[pos] = k
    return groups, tuple(lengths)


def experiment_dirs(data_dir: str | Path) -> list[Path]:
    """Experiment directories under data_dir (or data_dir itself when it is one)."""
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such data directory")
    if (root / "requests.json").exists():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


# the fields of a record that are integers, with their bounds; and those that are seconds
REQUEST_INTS = {
    "index": (-(2**62), 2**62),
    "arrival_time_us": (-(2**62), MAX_TIME_US),  # a negative one gets its own message below
    "input_tokens": (0, MAX_TOKENS),
    "output_tokens": (0, MAX_TOKENS),
}
TRUTH_INTS = {"index": REQUEST_INTS["index"]}
TRUTH_SECONDS = {"e2e_s": True, "ttft_s": False}  # field -> must be positive (else non-negative); ttft_s may be null


def _check_records(exp: str, file: str, records: list, ints: dict, seconds: dict | None = None) -> None:
    """Integers where the format has integers and numbers where it has seconds (never strings,
    booleans or, for integers, fractions, which numpy would quietly convert), each within its
    bounds, and booleans for has_error: a mistyped field is named, not misread."""
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise ExperimentError(exp, f"{file}: record {i} is not an object")
        for key, (lo, hi) in ints.items():
            _int_field(exp, f"{file}: {key} of record {i}", rec.get(key), lo, hi)
        for key, positive in (seconds or {}).items():
            v = rec.get(key)
            if v is not None or key == "e2e_s":
                _seconds_field(exp, f"{file}: {key} of record {i}", v, positive)
        if not isinstance(rec.get("has_error", False), bool):
            raise ExperimentError(
                exp, f"{file}: has_error of record {i} must be true or false, not {shown(rec['has_error'])}"
            )


def _shared_prefix(exp: str, profile) -> dict:
    """profile.json's data.shared_prefix (empty when absent); an error naming the file and field
    when the profile is not shaped as the format says."""
    if not isinstance(profile, dict):
        raise ExperimentError(exp, f"profile.json: expected an object, not {shown(profile)}")
    data = profile.get("data")
    if data is not None and not isinstance(data, dict):
        raise ExperimentError(exp, f"profile.json: data must be an object, not {shown(data)}")
    shared = (data or {}).get("shared_prefix")
    if shared is not None and not isinstance(shared, dict):
        raise ExperimentError(exp, f"profile.json: data.shared_prefix must be an object, not {shown(shared)}")
    return shared or {}


def _first_count(exp: str, hi: int, *candidates: tuple[str, object]) -> int:
    """The first of (where, value) that is given and not 0, checked as an integer in 0..hi; else 0."""
    for where, value in candidates:
        if _optional_int(exp, where, value, 0, hi):
            return value
    return 0


def _check_block_slots(exp: str, inputs: np.ndarray, outputs: np.ndarray, block: int) -> None:
    """The replay keeps a list of KV blocks per request, room for its whole sequence: refused over
    MAX_BLOCK_SLOTS in all (each request is already bounded; their number times their length is not)."""
    slots = int(((inputs + outputs) // block + 2).sum())
    if slots > MAX_BLOCK_SLOTS:
        raise ExperimentError(
            exp,
            f"requests.json: the requests need {slots:,} KV blocks of {block} tokens in all "
            f"(input + output tokens), over the replay's limit of {MAX_BLOCK_SLOTS:,}",
        )


def load_experiments(
    data_dir: str | Path, options: LoadOptions = LoadOptions()
) -> tuple[list[Experiment], list[ExperimentError]]:
    """Every experiment under data_dir: the good ones, and one error per bad one."""
    good, bad = [], []
    for d in experiment_dirs(data_dir):
        try:
            good.append(load_experiment(d, options))
        except ExperimentError as e:
            bad.append(e)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as e:
            # a field of an unexpected type or size that no specific check caught: still one line,
            # still only this experiment
            bad.append(
                ExperimentError(
                    d.name, f"unexpected content ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
                )
            )
    return good, bad
