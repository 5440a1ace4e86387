"""Trajectory surrogate: a replay's recorded schedule, re-timed for other constants by a dot product.

For a fixed schedule (which request gets how many tokens in which step) a request's latencies
are sums over the steps of its own lifetime:
  TTFT[r] = queueing_time[r] + (the rest of the step in flight when r became ready)
            + the steps from then to its first token + output_token_time
  E2E[r]  = TTFT[r] + its later steps' durations + output_token_time each + post_decode_time
(idle gaps inside a lifetime stay as recorded, and the step in flight counts with the share of
it that was left). Summed over the measured requests, the mean TTFT and mean E2E of a split are
fixed per-step weights times the step durations, plus the delays: linear in the step times.
Step times come from the numexpr back end over (population x steps) arrays, so a whole CMA-ES
population is scored per experiment in one call, milliseconds against a replay's ~0.1-0.5 s.

Why per lifetime and not one timeline: re-timing the whole recorded schedule (start of a step
= max(end of the previous, readiness of what it admits)) accumulates every change over tens of
thousands of back-to-back steps, while the real engine absorbs a slower step by batching more;
on three real experiments that version moved the mean E2E ~30x and the mean TTFT hundreds to
thousands of times more than the closed loop did for a 1% change of a constant. Per lifetime, a change moves the means as much as the steps each request
lives through.

The surrogate equals the closed-loop means at the constants it was recorded with (tested) and
is only a local model away from them (batching, preemption and time-outs are frozen);
`fitting.py` uses it inside a trust region and lets the closed-loop replay judge every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from numba import njit

from stepml_evolve.evaluator.choices import DEFAULT_SEMANTICS
from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.dsl import Program
from stepml_evolve.evaluator.dsl.linearity import nonaffine_inputs, read_inputs
from stepml_evolve.evaluator.dsl.numexpr_compile import VectorFunction, compile_vector, evaluate_vector
from stepml_evolve.evaluator.dsl.vm import CompiledProgram
from stepml_evolve.evaluator.hardware.components import COMPONENT_NAMES, component_values
from stepml_evolve.evaluator.replay.closed_loop import ReplayResult, experiment_coefficients, replay
from stepml_evolve.evaluator.replay.state import FINISHED, MAX_US
from stepml_evolve.evaluator.scoring.metrics import MetricRow, failed_row, split_horizon, split_metrics


@dataclass(frozen=True)
class VectorProgram:
    """A program's functions as numexpr statements (None where the program omits one)."""

    step_time: VectorFunction
    queueing_time: VectorFunction | None
    output_token_time: VectorFunction | None
    post_decode_time: VectorFunction | None
    constant_names: tuple[str, ...]
    queue_reads_request: bool  # queueing_time depends on the request (else one value per vector)
    queue_reads_step: bool = False  # queueing_time reads r.last_step_us (a step's duration: moves with the constants)
    # indices (into COMPONENT_NAMES) of the components step_time is not affine in: only they
    # tell step classes apart (see `_classes`); None: every component
    class_keys: tuple[int, ...] | None = None
    # the rows of a request table (REQUEST_ROWS) that tell request classes apart: the inputs
    # queueing_time is not affine in (through r.last_step_us, the components step_time reads
    # when queueing_time is not affine in it, else the ones step_time is not affine in)
    request_keys: tuple[int, ...] | None = None

    @classmethod
    def of(cls, program: Program) -> VectorProgram:
        def maybe(name):
            return compile_vector(program, name) if name in program.functions else None

        queue = maybe("queueing_time")
        text = " ".join([queue.result, *(x for _, x in queue.statements)]) if queue is not None else ""
        step_keys = nonaffine_inputs(program, "step_time", "f", COMPONENT_NAMES)
        fields = nonaffine_inputs(program, "queueing_time", "r", ["input_tokens", "output_tokens", "last_step_us"])
        request_keys = [f"r_{n}" for n in fields if n != "last_step_us"]
        if "r_last_step_us" in text:
            arrival = read_inputs(program, "step_time", "f", COMPONENT_NAMES) if "last_step_us" in fields else step_keys
            request_keys += ["arrival_step", *(f"f_{n}" for n in arrival)]
        return cls(
            compile_vector(program, "step_time"),
            queue,
            maybe("output_token_time"),
            maybe("post_decode_time"),
            tuple(program.constants),
            "r_" in text,
            "r_last_step_us" in text,
            tuple(COMPONENT_NAMES.index(n) for n in step_keys),
            tuple(REQUEST_ROWS.index(k) for k in request_keys),
        )

    def constant_inputs(self, population: np.ndarray) -> dict[str, np.ndarray]:
        """c_<name> as (P, 1) columns, so they broadcast against per-step or per-request rows."""
        return {f"c_{n}": population[:, j, None] for j, n in enumerate(self.constant_names)}


# a request table's rows: the fields queueing_time may read, whether a step ran before the
# request's arrival (r.last_step_us is 0 if not: 0 or 1) and that step's components
REQUEST_ROWS = ["r_input_tokens", "r_output_tokens", "arrival_step", *(f"f_{n}" for n in COMPONENT_NAMES)]


def _us(x: np.ndarray) -> np.ndarray:
    """Durations as the replay rounds them (integer us, capped); NaN stays NaN."""
    return np.round(np.minimum(x, MAX_US))


@dataclass
class TrajectoryModel:
    """One experiment's recorded replay on one split, reduced to the weights its means need.

    mean(c) = recorded mean + gain * (linear(c) - linear(recorded constants)) / n_ok, where linear(c) =
    step_us(c) . weight + summed queueing_time of the measured requests + count *
    output_token_time (+ finished * post_decode_time for E2E)."""

    name: str
    n_ok: int  # requests of the split that succeeded in reality (the ones measured)
    observed_us: np.ndarray  # (2,) measured mean E2E, TTFT
    recorded_us: np.ndarray  # (2,) the closed loop's predicted means at the recorded constants
    components: dict[str, np.ndarray]  # f_<name> -> (G,) per step class (see `_classes`)
    weight: np.ndarray  # (2, G): E2E and TTFT weight of each class's step duration
    queued_count: np.ndarray  # (2,) requests whose queueing_time enters the summed E2E, TTFT
    out_tok_count: np.ndarray  # (2,) output_token_time terms in the summed E2E, TTFT
    n_finished: int  # post_decode_time terms in the summed E2E
    linear0: np.ndarray  # (2,) linear() at the recorded constants
    gain: np.ndarray = field(default_factory=lambda: np.ones(2))  # see learn_gain
    # when queueing_time reads a request: those requests in classes of near-equal REQUEST_ROWS
    # (`_classes` again, binning the program's request_keys), each row's class means, and (2, Q)
    # how many of the summed E2E and TTFT's requests each class stands for
    requests: dict[str, np.ndarray] | None = None
    request_weight: np.ndarray | None = None


def recorded_replay(
    exp: Experiment,
    compiled: CompiledProgram,
    constants: np.ndarray,
    split: str,
    semantics: str = DEFAULT_SEMANTICS,
    floor: bool = False,
) -> ReplayResult:
    """`exp` replayed closed-loop up to `split`'s horizon with its steps and each request's runs of
    steps kept (not the per-slot rows): what a re-timing (record) and the residuals read."""
    return replay(
        exp,
        compiled,
        constants,
        horizon=split_horizon(exp, (split,)),
        record=True,
        semantics=semantics,
        rows=False,
        floor=floor,
    )


def record(
    exp: Experiment,
    compiled: CompiledProgram,
    vector: VectorProgram,
    constants: np.ndarray,
    split: str = "train",
    semantics: str = DEFAULT_SEMANTICS,
    pending: bool = False,
    floor: bool = False,
) -> tuple[MetricRow, TrajectoryModel | PendingModel | None]:
    """Closed-loop replay of `exp` on `split` with the trajectory kept: its metric row (what
    the closed loop judges) and the model to re-time it (None if the replay failed; pending:
    a PendingModel, built when asked for). floor: a step below its floor fails it (replay())."""
    res = recorded_replay(exp, compiled, constants, split, semantics, floor)
    if not res.ok:
        return failed_row(exp, split, res.failure()), None
    row = split_metrics(exp, res, split)
    model = PendingModel(exp, res, row, vector, constants, split)
    return row, model if pending else model.model()


class PendingModel:
    """A recording's TrajectoryModel, built when first asked for (`model()`). A fit judges more
    points than it accepts, and a rejected point needs only its closed-loop means (`recorded_us`)
    and the gain learned from it: building the model (step classes, weights) for every judged
    point took 45 of the 301 CPU seconds of four generations on the real data (docs/HISTORY.md)."""

    def __init__(self, exp, res, row, vector, constants, split):
        self._recording = (exp, res, row, vector, constants)
        self._ok = exp.split_mask(split) & ~exp.failed  # the split's requests that succeeded in reality
        self.n_ok = int(self._ok.sum())
        self.recorded_us = np.array([row.predicted.e2e_mean_s, row.predicted.ttft_mean_s]) * 1e6
        self.gain = np.ones(2)  # see learn_gain; the model takes it when built
        self._model: TrajectoryModel | None = None

    def model(self) -> TrajectoryModel:
        if self._model is None:
            self._model = self._build()
            self._recording = None  # the replay's trajectory is no longer needed
        self._model.gain = self.gain
        return self._model

    def _build(self) -> TrajectoryModel:
        """The model from the replay (with its trajectory) and its metric row."""
        exp, res, row, vector, constants = self._recording
        ok, n_ok = self._ok, self.n_ok
        t = res.trajectory
        n_steps = t.n_steps
        comps = np.array(component_values(*t.totals.T, experiment_coefficients(exp)), dtype=np.float64)
        model = TrajectoryModel(
            name=exp.name,
            n_ok=n_ok,
            observed_us=np.array([row.observed.e2e_mean_s, row.observed.ttft_mean_s]) * 1e6,
            recorded_us=self.recorded_us.copy(),
            components={f"f_{n}": comps[i] for i, n in enumerate(COMPONENT_NAMES)},
            weight=np.zeros((2, n_steps)),
            queued_count=np.zeros(2),
            out_tok_count=np.zeros(2),
            n_finished=0,
            linear0=np.zeros(2),
        )
        if vector.queue_reads_request:
            model.requests, model.request_weight = _request_classes(
                np.zeros((len(REQUEST_ROWS), 0)), np.zeros((2, 0)), vector
            )
        if n_ok == 0 or n_steps == 0:  # nothing to re-time (no step ran: every request gave up queueing)
            return model

        life = lifetimes(exp, res, vector, constants, ok, comps)
        finished, timed = life.finished, life.timed

        def lifetime_weight(mask):
            w = np.bincount(life.after[mask], minlength=n_steps + 1)[: n_steps + 1].astype(np.float64)
            w -= np.bincount(life.first[mask] + 1, minlength=n_steps + 1)[: n_steps + 1]
            w = np.cumsum(w)[:n_steps]
            fl = mask & (life.in_flight >= 0)
            return w + np.bincount(life.in_flight[fl], weights=life.left[fl], minlength=n_steps)

        decode_steps, n_decoding = _decode_steps(t.runs, finished, life.first, n_steps)
        fin_timed = finished & timed
        reps, model.weight = _classes(
            comps, np.stack([lifetime_weight(fin_timed) + decode_steps, lifetime_weight(timed)]), vector.class_keys
        )
        model.components = {f"f_{n}": reps[i] for i, n in enumerate(COMPONENT_NAMES)}
        model.queued_count = np.array([fin_timed.sum(), timed.sum()], dtype=np.float64)
        if life.table is not None:
            model.requests, model.request_weight = _request_classes(life.table, np.stack([fin_timed, timed]), vector)
        model.out_tok_count = np.array([fin_timed.sum() + n_decoding, timed.sum()], dtype=np.float64)
        model.n_finished = int(finished.sum())
        model.linear0 = linear(
            model, vector, constants[None, :], step_us(model.components, vector, constants[None, :])[0]
        )[0]
        return model


@dataclass
class Lifetimes:
    """Where each request of a recorded replay lives on its schedule: what its TTFT and E2E sum.

    TTFT sums the share `left` of the step in flight when it became ready (`in_flight`, -1: the
    engine was idle), then the steps `after` .. `first` (the one that gave its first token); E2E
    adds the steps of its runs after `first` (the trajectory's `runs`). `timed`: the measured
    requests whose first token came before the client's limit (the others count at the limit,
    fixed); `finished`: those measured that finished. `table`: the requests' REQUEST_ROWS when
    queueing_time reads them (else None)."""

    ready: np.ndarray
    out_tok: float
    finished: np.ndarray
    timed: np.ndarray
    first: np.ndarray
    in_flight: np.ndarray
    left: np.ndarray
    after: np.ndarray
    table: np.ndarray | None


def lifetimes(
    exp: Experiment, res, vector: VectorProgram, constants: np.ndarray, ok: np.ndarray, comps: np.ndarray
) -> Lifetimes:
    """The measured requests' (`ok`) lifetimes on `res`'s recorded schedule (`comps`: its steps'
    components), with queueing_time and output_token_time at `constants` as the replay rounds them."""
    t = res.trajectory
    start, dt = t.step_start_us.astype(np.float64), t.step_us.astype(np.float64)
    end = start + dt
    table = None
    if vector.queue_reads_request:
        table = np.zeros((len(REQUEST_ROWS), exp.n_requests))
        table[0], table[1] = exp.input_tokens, exp.output_tokens
        if vector.queue_reads_step:  # the last step started before each arrival (recorded schedule)
            before = np.searchsorted(t.step_start_us, exp.arrival_us, side="left") - 1
            table[2] = before >= 0
            table[3:] = comps[:, np.maximum(before, 0)]
    ready, out_tok = _recorded_delays(vector, constants, table, exp.arrival_us)
    limit = exp.abort_after_us
    finished = ok & (res.state == FINISHED)
    # TTFT moves with the steps only for requests that got their first token before the client's
    # limit (the others count at the limit, fixed); E2E only for finished requests
    timed = ok & (res.ttft_us >= 0) & (res.ttft_us <= limit)
    first = np.full(exp.n_requests, -1, np.int64)
    first[timed] = np.searchsorted(end, exp.arrival_us[timed] + res.ttft_us[timed] - out_tok)
    # the step in flight when each request became ready (-1: none, the engine was idle) and the
    # share of it left
    in_flight = np.searchsorted(start, ready, side="right") - 1
    in_flight = np.where((in_flight >= 0) & (end[np.maximum(in_flight, 0)] > ready), in_flight, -1)
    left = np.where(in_flight >= 0, (end[np.maximum(in_flight, 0)] - ready) / dt[np.maximum(in_flight, 0)], 0.0)
    # pre-first-token steps: in_flight+1 .. first, `left` of in_flight
    after = np.where(in_flight >= 0, in_flight + 1, np.searchsorted(start, ready, side="left"))
    return Lifetimes(ready, out_tok, finished, timed, first, in_flight, left, after, table)


@njit(cache=True, nogil=True, error_model="numpy")
def _decode_steps(runs, finished, first, n_steps):
    """Per step, the tokens it decoded for finished requests after their first token, and their
    total: from each request's runs of consecutive steps, through a difference array (the
    trajectory's rows, one per scheduled request per step, are tens of millions on the real data)."""
    out = np.zeros(n_steps + 1)
    total = 0
    for i in range(runs.shape[0]):
        r = runs[i, 0]
        if finished[r]:
            a = max(runs[i, 1], first[r] + 1)
            b = runs[i, 2]
            if a <= b:
                out[a] += 1.0
                out[b + 1] -= 1.0
                total += b - a + 1
    return np.cumsum(out)[:n_steps], total


CLASS_WIDTH = 1.05  # steps whose component values agree within 5% share one class


@njit(cache=True, nogil=True)
def _class_hash(comps, mix, log_width):
    """Per step (column), sum over components of round(log1p|c| / log_width) * sign(c) * mix, in
    int64 arithmetic (wrapping): the same numbers numpy's array expressions give, in one pass."""
    n_c, n = comps.shape
    h = np.zeros(n, np.int64)
    for i in range(n_c):
        for j in range(n):
            c = comps[i, j]
            h[j] += np.int64(np.round(np.log1p(np.abs(c)) / log_width)) * np.int64(np.sign(c)) * mix[i]
    return h


@njit(cache=True, nogil=True)
def _class_sums(cls, n_cls, weight, comps):
    """Per weight row and class: its steps' summed weight (W, C) and weighted component sums
    (W, R, C), each added in step order as np.bincount adds them (one pass over the components
    for every weight row)."""
    n_w = weight.shape[0]
    total = np.zeros((n_w, n_cls))
    sums = np.zeros((n_w, comps.shape[0], n_cls))
    for j in range(len(cls)):
        for r in range(n_w):
            total[r, cls[j]] += weight[r, j]
    for i in range(comps.shape[0]):
        for j in range(len(cls)):
            c, k = comps[i, j], cls[j]
            for r in range(n_w):
                sums[r, i, k] += weight[r, j] * c
    return total, sums


def _classes(
    comps: np.ndarray, weight: np.ndarray, keys: tuple[int, ...] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Columns (steps, or requests) grouped into classes of near-equal rows, for each weight row
    separately: each class is its columns' weighted mean rows (R, G) with their summed weight
    (W, G). Exact in the rows the program is affine in (sum of w * f(comp) = W * f(weighted
    mean)), so only the others (`keys`: inside max, if-else, a product of two inputs, ...) are
    binned, to within the class width; a program affine in every row has one class per weight
    row. Binning every component gave about 24x fewer classes than steps on the real data
    (trained_physics: 56,530 for the two weights against 686,000 steps); binning only the keys
    gives trained_physics two per experiment."""
    keyed = comps if keys is None else comps[list(keys)]
    # one 64-bit hash per column of its keys' log-width bins, instead of a unique over columns
    # (10x faster; a collision merely merges two classes)
    mix = np.random.default_rng(0).integers(1, 2**62, size=len(keyed), dtype=np.int64) | 1
    # pandas' hash table labels them as np.unique(return_inverse=True) does (classes in the order of
    # their hashes), several times faster
    cls, hashes = pd.factorize(_class_hash(keyed, mix, np.log(CLASS_WIDTH)), sort=True)
    total, sums = _class_sums(cls, len(hashes), weight.astype(np.float64), comps)
    cols, weights = [], []
    for i in range(len(weight)):
        keep = total[i] > 0
        cols.append(sums[i][:, keep] / total[i][keep])
        row = np.zeros((len(weight), keep.sum()))
        row[i] = total[i][keep]
        weights.append(row)
    return np.concatenate(cols, axis=1), np.concatenate(weights, axis=1)


def _request_classes(
    table: np.ndarray, measured: np.ndarray, vector: VectorProgram
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The requests of `table` (REQUEST_ROWS x n) in the E2E and TTFT sums (`measured`, (2, n)
    masks) in classes: each row's class means by name, and (2, Q) the requests each stands for."""
    reps, weight = _classes(table, measured, vector.request_keys)
    return dict(zip(REQUEST_ROWS, reps, strict=True)), weight


def _recorded_delays(
    vector: VectorProgram, constants: np.ndarray, table: np.ndarray | None, arrival_us: np.ndarray
) -> tuple[np.ndarray, float]:
    """Ready times (n,) and output_token_time at the recorded constants, rounded as the replay
    does; `table`: the requests' REQUEST_ROWS when queueing_time reads them."""
    consts = vector.constant_inputs(constants[None, :])
    ready = arrival_us.astype(np.float64)
    if vector.queueing_time is not None:
        if table is None:
            ready = ready + _scalar_delay(vector.queueing_time, consts, 1)[0]
        else:
            ready = (
                ready + _request_queue_us(vector, constants[None, :], dict(zip(REQUEST_ROWS, table, strict=True)))[0]
            )
    return ready, float(_scalar_delay(vector.output_token_time, consts, 1)[0])


def _request_queue_us(
    vector: VectorProgram, population: np.ndarray, requests: dict[str, np.ndarray], last: np.ndarray | None = None
) -> np.ndarray:
    """(P, n) queueing_time of the n requests (or request classes) of `requests`, rounded as the
    replay rounds it. `last`: when the program reads r.last_step_us, the step in flight at each
    arrival re-timed, (P, n), if the caller has it (SurrogateSet: from its one step_time pass);
    else it is computed here."""
    p, n = len(population), len(requests["r_input_tokens"])
    fields = {"r_input_tokens": requests["r_input_tokens"], "r_output_tokens": requests["r_output_tokens"]}
    if vector.queue_reads_step:  # the arrival's step in flight, re-timed (rounded as the replay rounds a step)
        if last is None:
            last, _ = step_us({k: v for k, v in requests.items() if k.startswith("f_")}, vector, population)
        fields["r_last_step_us"] = np.where(requests["arrival_step"] > 0, np.round(last), 0.0)
    q = evaluate_vector(vector.queueing_time, {**vector.constant_inputs(population), **fields})
    return np.maximum(0.0, _us(np.broadcast_to(q, (p, n))))


def delay_part(
    model: TrajectoryModel,
    vector: VectorProgram,
    population: np.ndarray,
    shared: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    queued: np.ndarray | None = None,
) -> np.ndarray:
    """(P, 2): the summed E2E and TTFT terms from queueing_time, output_token_time, post_decode_time.
    `shared`: those three per vector when they do not depend on the request (see shared_delays);
    `queued`: (P, 2) the summed per-request queueing times, when the caller computed them
    (SurrogateSet, in one pass over all its models)."""
    p = len(population)
    q, out_tok, post = shared if shared is not None else shared_delays(vector, population)
    sums = np.zeros((p, 2))
    if queued is not None:
        sums += queued
    elif vector.queue_reads_request:
        sums += _request_queue_us(vector, population, model.requests) @ model.request_weight.T
    else:
        sums += q[:, None] * model.queued_count
    sums[:, 0] += model.out_tok_count[0] * out_tok + model.n_finished * post
    sums[:, 1] += model.out_tok_count[1] * out_tok
    return sums


def shared_delays(vector: VectorProgram, population: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P,) each: queueing_time (when it reads no request field; else zeros), output_token_time,
    post_decode_time, rounded as the replay rounds them."""
    consts = vector.constant_inputs(population)
    p = len(population)
    q = np.zeros(p)
    if vector.queueing_time is not None and not vector.queue_reads_request:
        q = _scalar_delay(vector.queueing_time, consts, p)
    return q, _scalar_delay(vector.output_token_time, consts, p), _scalar_delay(vector.post_decode_time, consts, p)


def _scalar_delay(vf: VectorFunction | None, consts: dict, p: int) -> np.ndarray:
    if vf is None:
        return np.zeros(p)
    return np.maximum(0.0, _us(np.broadcast_to(evaluate_vector(vf, consts), (p, 1))[:, 0]))


def linear(model: TrajectoryModel, vector: VectorProgram, population: np.ndarray, dt: np.ndarray) -> np.ndarray:
    """(P, 2): the parts of the summed E2E and TTFT that move with the constants."""
    return (dt @ model.weight.T) + delay_part(model, vector, population)


def step_us(
    components: dict[str, np.ndarray], vector: VectorProgram, population: np.ndarray, judged: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(P, G) step durations of each class of `components` (not rounded: a class stands for many
    steps), and (P,) whether every one (of the first `judged`, if given) is valid (finite,
    positive and at most MAX_US, as the replay requires)."""
    width = len(next(iter(components.values())))
    x = np.broadcast_to(
        evaluate_vector(vector.step_time, {**components, **vector.constant_inputs(population)}),
        (len(population), width),
    )
    judged_x = x[:, :judged]
    valid = np.all(np.isfinite(judged_x) & (judged_x > 0) & (judged_x <= MAX_US), axis=1)
    return np.maximum(1.0, np.minimum(np.where(np.isfinite(x), x, 1.0), MAX_US)), valid


def shift_us(model: TrajectoryModel, vector: VectorProgram, population: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P, 2) change of the mean E2E and TTFT (us) from the recorded constants, before the gain,
    and (P,) whether the replay could run (finite, positive step times; finite delays)."""
    dt, valid = step_us(model.components, vector, population)
    lin = linear(model, vector, population, dt)
    valid &= np.all(np.isfinite(lin), axis=1)
    return (lin - model.linear0) / max(model.n_ok, 1), valid


def retime(model: TrajectoryModel, vector: VectorProgram, population: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Predicted APE of mean E2E and mean TTFT, each (P,), for a population (P, K) of constant
    vectors on the recorded schedule; inf where the replay would fail (a non-finite, non-positive
    or overflowing step time, or a non-finite delay); NaN for both when the split measures no request."""
    e2e, ttft = SurrogateSet([model], vector).apes(population)
    return e2e[:, 0], ttft[:, 0]


GAIN_RANGE = (0.5, 50.0)


def learn_gain(model: TrajectoryModel, shift: np.ndarray, moved_us: np.ndarray) -> np.ndarray:
    """Gain of each mean after the closed loop moved it by `moved_us` where the surrogate (gain 1)
    predicted `shift`. A busy engine queues more when its steps get slower, so the closed loop
    moves the means more than the frozen schedule does: on the real data 1.1-2.3x for E2E (3-5x
    on the overloaded reasoning runs), and 5x or more for the TTFT of a workload near saturation
    (its queue grows with the load; one judged step on Llama-2-70B general moved TTFT ~6x the
    surrogate's prediction). The gain
    is the latest ratio of the two, kept in GAIN_RANGE; a shift too small to measure (below 0.1%
    of the mean) or of the other sign leaves the gain as it was."""
    gain = model.gain.copy()
    for i in range(2):
        if abs(shift[i]) > 1e-3 * abs(model.recorded_us[i]) and moved_us[i] * shift[i] > 0:
            gain[i] = float(np.clip(moved_us[i] / shift[i], *GAIN_RANGE))
    return gain


class _Segments:
    """Per-model columns of a concatenation (step classes, or request classes): model j's are
    columns starts[nonempty == j]..., summed per model and weight row by one reduceat."""

    def __init__(self, weights: list[np.ndarray]):
        sizes = np.array([w.shape[1] for w in weights], dtype=np.int64)
        ends = np.cumsum(sizes)
        self.n_models, self.n_columns = len(weights), int(ends[-1]) if len(weights) else 0
        self.nonempty = np.flatnonzero(sizes > 0)  # a model may have no weighted column at all
        self.starts = (ends - sizes)[self.nonempty]
        self.weight = np.concatenate(weights, axis=1) if weights else np.zeros((2, 0))

    def sums(self, values: np.ndarray) -> np.ndarray:
        """(P, models, 2): each model's weighted sum of `values` (P, columns), per weight row."""
        out = np.zeros((len(values), self.n_models, 2))
        if len(self.nonempty):
            for row, w in enumerate(self.weight):
                out[:, self.nonempty, row] = np.add.reduceat(values * w, self.starts, axis=1)
        return out


class SurrogateSet:
    """The models of several experiments scored together: one numexpr pass over all their step
    classes per population (the per-call overhead of numexpr dominates one experiment's few
    thousand classes), then per-experiment sums by segment; the same for their request classes
    when queueing_time reads a request."""

    def __init__(self, models: list[TrajectoryModel], vector: VectorProgram):
        self.models, self.vector = models, vector
        self.live = [i for i, m in enumerate(models) if m.n_ok]
        parts = [models[i] for i in self.live]
        self.components = (
            {k: np.concatenate([m.components[k] for m in parts]) for k in parts[0].components} if parts else {}
        )
        self.steps = _Segments([m.weight for m in parts])
        self.n_classes = self.steps.n_columns
        self.requests = None
        if parts and vector.queue_reads_request:
            self.requests = {k: np.concatenate([m.requests[k] for m in parts]) for k in REQUEST_ROWS}
            self.queued = _Segments([m.request_weight for m in parts])
            # a queueing_time reading r.last_step_us re-times the step in flight at each request
            # class's arrival: those steps join the same step_time pass, after the step classes
            if vector.queue_reads_step:
                self.components = {k: np.concatenate([v, self.requests[k]]) for k, v in self.components.items()}

    def apes(self, population: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P, E) predicted APE of mean E2E and of mean TTFT for every model (NaN where a model
        measures no request; inf for vectors whose replay would fail)."""
        means, ok = self.means(population)
        observed = np.array([m.observed_us for m in self.models]).reshape(len(self.models), 2)
        with np.errstate(divide="ignore", invalid="ignore"):  # a model measuring no request is NaN
            ape = np.abs(means - observed) / observed * 100.0
        ape[~ok] = np.inf
        live = np.zeros(len(self.models), bool)
        live[self.live] = True
        ape[:, ~live] = np.nan
        return ape[..., 0], ape[..., 1]

    def means(self, population: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P, E, 2) predicted mean E2E and TTFT (us) of every model (NaN where a model measures
        no request), and (P, E) whether the replay could run (finite, positive step times;
        finite delays)."""
        p, e = len(population), len(self.models)
        means, ok = np.full((p, e, 2), np.nan), np.ones((p, e), bool)
        if not self.live:
            return means, ok
        every, valid = step_us(self.components, self.vector, population, judged=self.n_classes)
        sums = self.steps.sums(every[:, : self.n_classes])
        shared = shared_delays(self.vector, population)
        queued = None
        if self.requests is not None:
            last = every[:, self.n_classes :] if self.vector.queue_reads_step else None
            queued = self.queued.sums(_request_queue_us(self.vector, population, self.requests, last))
        for j, i in enumerate(self.live):
            m = self.models[i]
            lin = sums[:, j] + delay_part(
                m, self.vector, population, shared, queued=queued[:, j] if queued is not None else None
            )
            ok[:, i] = valid & np.all(np.isfinite(lin), axis=1)
            means[:, i] = m.recorded_us + m.gain * (lin - m.linear0) / m.n_ok
        return means, ok
