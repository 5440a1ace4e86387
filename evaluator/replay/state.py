"""The replay's state: request states and statuses, the rule for a duration, the recorded runs of
scheduled steps, and the heap of arrived requests waiting out their queueing time (numba)."""

from __future__ import annotations

import numpy as np
from numba import njit

from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX, component_values
from stepml_evolve.evaluator.physics.floor import ADDED_TIMES, BYTE_TIMES, FLOP_TIMES
from stepml_evolve.evaluator.physics.floor import TOLERANCE as FLOOR_TOLERANCE

# request states
WAITING_TO_ARRIVE, QUEUED, RUNNING, FINISHED, TIMED_OUT = 0, 1, 2, 3, 4
# simulation status
OK, BAD_STEP_TIME, STEP_LIMIT, TRAJECTORY_FULL, BAD_QUEUE_TIME, BELOW_FLOOR = 0, 1, 2, 3, 4, 5
# what the replay writes in its diag array (floats): the offending value and which function gave it,
# prompt-cache counts, runs and stretch steps, and for a step below the floor its floor and batch
DIAG_VALUE, DIAG_FUNCTION, DIAG_CACHED, DIAG_ADMITTED, DIAG_RUNS, DIAG_STRETCH = 0, 1, 2, 3, 4, 5
DIAG_FLOOR, DIAG_TOK_PF, DIAG_N_PF, DIAG_N_DC, DIAG_CTX_MAX = 6, 7, 8, 9, 10
DIAG_SIZE = 11

NO_DEADLINE = np.iinfo(np.int64).max
# The semantics (SEMANTICS, evaluator/choices.py): where BLIS's accounting and vLLM's differ (both
# share the block-level prefix cache above):
#   first chunk of an admitted request with cached prompt blocks: BLIS costs it with no context
#     (its ProgressIndex is advanced only after the step), vLLM with the cached tokens as context;
#   a fully cached prompt: BLIS admits it with no token to compute, vLLM recomputes its last token;
#   a client deadline inside a step: BLIS finishes a request that step completes (it runs a step
#     at its start), vLLM's client has gone by the step's end;
#   a finishing request: BLIS stores its last token's KV (taking a block if its last one is full,
#     which evicts that block's cached content) before freeing its blocks.
MAX_US = 1e15  # the longest duration a program may return (31 years): over it is an overflow, as non-finite


@njit(cache=True, nogil=True)
def _valid_duration(x: float) -> bool:
    """The one rule for a duration a program returns (us): finite and at most MAX_US. Over MAX_US is
    an overflow (e.g. exp(exp(exp(x))): exp is clamped, so it stays finite) and fails the replay as
    NaN does, so eval and fit judge it alike. (The emitted Go still caps at MAX_US.)"""
    return np.isfinite(x) and x <= MAX_US


_component_values = njit(cache=True, nogil=True)(component_values)

_FLOPS = tuple(COMPONENT_INDEX[n] for n in FLOP_TIMES)
_BYTES = tuple(COMPONENT_INDEX[n] for n in BYTE_TIMES)
_ADDED = tuple(COMPONENT_INDEX[n] for n in ADDED_TIMES)


@njit(cache=True, nogil=True)
def _below_floor(x: float, v) -> float:
    """The step's floor (soundness/floor.py floor_of: the roofline of its work at peak plus the
    all-reduce, from its component values `v`) when the duration x falls below it; 0 otherwise."""
    flops, bytes_, added = 0.0, 0.0, 0.0
    for i in _FLOPS:
        flops += v[i]
    for i in _BYTES:
        bytes_ += v[i]
    for i in _ADDED:
        added += v[i]
    floor = max(flops, bytes_) + added
    return floor if x < floor * (1.0 - FLOOR_TOLERANCE) else 0.0


@njit(cache=True, nogil=True)
def _record_slot(traj, row, step, tok, context, is_prefill, r):
    traj[row, 0] = step
    traj[row, 1] = tok
    traj[row, 2] = context
    traj[row, 3] = 1 if is_prefill else 0
    traj[row, 4] = r


@njit(cache=True, nogil=True)
def _open_run(runs, n_runs, open_run, r, step):
    """Request r, with no open run, is scheduled in `step`: open a run of consecutive steps
    (request, first step, last step). The new count of runs; -1 when `runs` is full.

    A run stays open while r is scheduled in every step, and is closed (`_close_run`) where r
    misses one (skipped, preempted) or leaves the batch. The replay counts the running requests
    without an open run (admitted with nothing to compute, or skipped), and looks a scheduled
    request's run up only while there are any: the hot loop does no work per request for it."""
    if n_runs >= runs.shape[0]:
        return -1
    runs[n_runs, 0] = r
    runs[n_runs, 1] = step
    open_run[r] = n_runs
    return n_runs + 1


@njit(cache=True, nogil=True)
def _close_run(runs, open_run, r, last):
    """r's open run ends at step `last`, the last it was scheduled in: 1 if it had one, else 0."""
    if open_run[r] < 0:
        return 0
    runs[open_run[r], 2] = last
    open_run[r] = -1
    return 1


@njit(cache=True, nogil=True)
def _leave(runs, open_run, r, last, unopened):
    """Running request r leaves the batch (finished, timed out, preempted) after step `last`: its
    run closed, and the new count of running requests without an open run (unchanged when not
    recording)."""
    if open_run.shape[0] == 0:
        return unopened
    return unopened - 1 + _close_run(runs, open_run, r, last)


@njit(cache=True, nogil=True)
def _ceil_div(a, b):
    return (a + b - 1) // b


# ---- requests that arrived and wait out their queueing time: a binary min-heap by (ready, r),
# so equal ready times keep arrival order (as BLIS orders events of one tick) ----


@njit(cache=True, nogil=True)
def _before(a, b, ready):
    return ready[a] < ready[b] or (ready[a] == ready[b] and a < b)


@njit(cache=True, nogil=True)
def _heap_push(heap, size, r, ready):
    i = size
    heap[i] = r
    while i > 0:
        p = (i - 1) // 2
        if not _before(heap[i], heap[p], ready):
            break
        heap[i], heap[p] = heap[p], heap[i]
        i = p
    return size + 1


@njit(cache=True, nogil=True)
def _heap_pop(heap, size, ready):
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        left, right, m = 2 * i + 1, 2 * i + 2, i
        if left < size and _before(heap[left], heap[m], ready):
            m = left
        if right < size and _before(heap[right], heap[m], ready):
            m = right
        if m == i:
            break
        heap[i], heap[m] = heap[m], heap[i]
        i = m
    return top, size


@njit(cache=True, nogil=True)
def _next_event(t, arrival, order, nxt_arrival, ready, heap, n_heap):
    """The earliest of t, the next arrival and the next ready time."""
    if nxt_arrival < arrival.shape[0] and arrival[order[nxt_arrival]] < t:
        t = arrival[order[nxt_arrival]]
    if n_heap > 0 and ready[heap[0]] < t:
        t = ready[heap[0]]
    return t
