"""Closed-loop replay of a vLLM-v1-like scheduler with one program as the step-time model.

Each step (read top to bottom like vLLM's scheduler):
  1. a request's queueing_time is computed when it arrives (it may read the duration of the last
     step started before, r.last_step_us, as BLIS's model sees it: the step in flight, or the last
     one if the engine is idle); requests whose ready time (arrival + queueing_time) has come
     join the waiting queue;
     client timeouts remove requests wherever they are and free their KV blocks;
  2. running requests in batch order get tokens under the max_num_batched_tokens budget
     (a prefill chunk min(remaining prompt, budget), a decode 1); a request whose KV blocks
     cannot be allocated preempts the tail of the batch (recompute: blocks freed, progress
     reset, back to the front of the waiting queue) until it fits or is itself the victim;
  3. only if nothing was preempted, waiting requests are admitted from the head while seats
     and budget last; a cached system-prompt prefix (full blocks) is not recomputed; a head
     that cannot get its blocks stops admission;
  4. the program maps the step's components to a duration (integer us, as in Go) and the
     clock advances; prefill progress advances, a completed prompt yields the first token,
     decodes yield one token each, finished requests free their blocks.
Timing follows BLIS (see DESIGN.md): TTFT = end of the prefill-completing step - arrival +
output_token_time; each later token adds its step's duration + output_token_time;
E2E = TTFT + those + post_decode_time. A preempted request starts over.

The loop is numba-compiled once; programs run on the stack machine of dsl/vm.py, so a new
program or constant vector costs no compilation. Steps in which the batch only decodes (and admits
a lone arrival) are taken without visiting the batch (`_decode_stretch`; docs/concepts/design-notes.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from numba import njit

from .components import N_COMPONENTS, coefficients, component_values
from .dsl.vm import LOCALS_SIZE, STACK_SIZE, CompiledProgram, run_code
from .experiments import Experiment

# request states
WAITING_TO_ARRIVE, QUEUED, RUNNING, FINISHED, TIMED_OUT = 0, 1, 2, 3, 4
# simulation status
OK, BAD_STEP_TIME, STEP_LIMIT, TRAJECTORY_FULL, BAD_QUEUE_TIME = 0, 1, 2, 3, 4

NO_DEADLINE = np.iinfo(np.int64).max
# Where BLIS's accounting and vLLM's differ (both share the block-level prefix cache above):
#   first chunk of an admitted request with cached prompt blocks: BLIS costs it with no context
#     (its ProgressIndex is advanced only after the step), vLLM with the cached tokens as context;
#   a fully cached prompt: BLIS admits it with no token to compute, vLLM recomputes its last token;
#   a client deadline inside a step: BLIS finishes a request that step completes (it runs a step
#     at its start), vLLM's client has gone by the step's end;
#   a finishing request: BLIS stores its last token's KV (taking a block if its last one is full,
#     which evicts that block's cached content) before freeing its blocks.
SEMANTICS = ("blis", "vllm")
DEFAULT_SEMANTICS = "blis"
MAX_US = 1e15  # the longest duration a program may return (31 years): over it is an overflow, as non-finite


@njit(cache=True, nogil=True)
def _valid_duration(x: float) -> bool:
    """The one rule for a duration a program returns (us): finite and at most MAX_US. Over MAX_US is
    an overflow (e.g. exp(exp(exp(x))): exp is clamped, so it stays finite) and fails the replay as
    NaN does, so eval and fit judge it alike. (The emitted Go still caps at MAX_US.)"""
    return np.isfinite(x) and x <= MAX_US


_component_values = njit(cache=True, nogil=True)(component_values)


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


# ---- the KV cache: blocks with reference counts, a free list in LRU order, prefix hashes ----
# As in vLLM and BLIS (sim/kv/cache.go): a request holds a list of blocks; blocks it releases go
# to the tail of the free list in reverse order and keep their content, so a later request (or
# the same one, readmitted after a preemption) whose prompt starts with that content hits them
# until a new allocation pops them from the head and overwrites them. Content identity stands in
# for the block hash (experiments.py, prompt_reuse.py): block i < gblocks[g] of a request in
# shared-prefix group g is key goff[g] + i; any other block i of request r is key pkey[r] + i,
# where requests that sent the same prompt have the same pkey. Only full prompt blocks filled
# during prefill are keyed (the others hold output tokens no prompt can match).


@njit(cache=True, nogil=True)
def _fl_remove(b, nxt, prv, head_tail):
    p, q = prv[b], nxt[b]
    if p >= 0:
        nxt[p] = q
    else:
        head_tail[0] = q
    if q >= 0:
        prv[q] = p
    else:
        head_tail[1] = p
    nxt[b] = -1
    prv[b] = -1
    head_tail[2] -= 1


@njit(cache=True, nogil=True)
def _fl_append(b, nxt, prv, head_tail):
    t = head_tail[1]
    prv[b] = t
    nxt[b] = -1
    if t >= 0:
        nxt[t] = b
    else:
        head_tail[0] = b
    head_tail[1] = b
    head_tail[2] += 1


# The helpers below take the KV cache's state as one tuple, kv = (block, nb, rtok, rblk, roff,
# ref, key, keymap, nxt, prv, head_tail, no_prompt), and the prompts' content keys as another,
# keys = (pgroup, gblocks, goff, pkey) (the arrays are shared: what a helper writes, all see).


@njit(cache=True, nogil=True)
def _key_of(r, i, keys):
    pgroup, gblocks, goff, pkey = keys
    g = pgroup[r]
    if g >= 0 and i < gblocks[g]:
        return goff[g] + i
    return pkey[r] + i


@njit(cache=True, nogil=True)
def _cached_prefix(r, max_blocks, keys, kv, gone):
    """(blocks at the start of r's prompt whose content is in the cache, stopping at the first
    miss; how many of those sit on the free list, unreferenced, so claiming them uses free blocks).
    gone: content keys to count as missing (those the step's earlier allocations will evict)."""
    ref, keymap = kv[5], kv[7]
    n = 0
    on_free_list = 0
    while n < max_blocks:
        kk = _key_of(r, n, keys)
        b = keymap[kk]
        if b < 0 or gone[kk]:
            break
        if ref[b] == 0:
            on_free_list += 1
        n += 1
    return n, on_free_list


@njit(cache=True, nogil=True)
def _release(r, kv):
    """Free r's blocks (last first, so the prompt's first blocks are evicted last)."""
    block, nb, rtok, rblk, roff, ref, key, keymap, nxt, prv, head_tail, no_prompt = kv
    for j in range(nb[r] - 1, -1, -1):
        b = rblk[roff[r] + j]
        ref[b] -= 1
        if ref[b] == 0:
            _fl_append(b, nxt, prv, head_tail)
    nb[r] = 0
    rtok[r] = 0
    no_prompt[r] = False


@njit(cache=True, nogil=True)
def _allocate(r, tok, in_prefill, inputs, kv, keys):
    """Store tok more tokens of r: fill its last block, then take blocks from the free list's head
    (dropping the content they held). Full prompt blocks written during prefill get their key
    (none when no_prompt[r]: its blocks start at its first output token)."""
    block, nb, rtok, rblk, roff, ref, key, keymap, nxt, prv, head_tail, no_prompt = kv
    spare = nb[r] * block - rtok[r]
    if spare > 0:
        fill = min(spare, tok)
        rtok[r] += fill
        tok -= fill
        last = nb[r] - 1
        if rtok[r] == nb[r] * block and nb[r] * block <= inputs[r] and not no_prompt[r]:
            kk = _key_of(r, last, keys)
            b = rblk[roff[r] + last]
            key[b] = kk
            keymap[kk] = b
    while tok > 0:
        b = head_tail[0]
        _fl_remove(b, nxt, prv, head_tail)
        if key[b] >= 0:  # its old content is gone (the key goes, whichever block it pointed to, as in BLIS)
            keymap[key[b]] = -1
            key[b] = -1
        ref[b] = 1
        rblk[roff[r] + nb[r]] = b
        fill = min(block, tok)
        nb[r] += 1
        rtok[r] += fill
        tok -= fill
        if fill == block and in_prefill and not no_prompt[r]:
            kk = _key_of(r, nb[r] - 1, keys)
            key[b] = kk
            keymap[kk] = b


@njit(cache=True, nogil=True)
def _claim_cached(r, n_cached, kv, keys):
    block, nb, rtok, rblk, roff, ref, key, keymap, nxt, prv, head_tail, no_prompt = kv
    for i in range(n_cached):
        b = keymap[_key_of(r, i, keys)]
        ref[b] += 1
        if ref[b] == 1:
            _fl_remove(b, nxt, prv, head_tail)
        rblk[roff[r] + nb[r]] = b
        nb[r] += 1
    return n_cached * block


@njit(cache=True, nogil=True)
def _finish(r, acc, post_decode, e2e, state, blis, inputs, kv, keys):
    """r got its last token: its E2E, done, and its blocks freed (BLIS first stores the last
    token's KV, taking a block if its last one is full)."""
    e2e[r] = acc[r] + post_decode
    state[r] = FINISHED
    if blis and kv[10][2] > 0:
        _allocate(r, 1, False, inputs, kv, keys)
    _release(r, kv)


@njit(cache=True, nogil=True)
def _next_event(t, arrival, order, nxt_arrival, ready, heap, n_heap):
    """The earliest of t, the next arrival and the next ready time."""
    if nxt_arrival < arrival.shape[0] and arrival[order[nxt_arrival]] < t:
        t = arrival[order[nxt_arrival]]
    if n_heap > 0 and ready[heap[0]] < t:
        t = ready[heap[0]]
    return t


@njit(cache=True, nogil=True)
def _decode_stretch(
    running,
    n_running,
    progress,
    generated,
    outputs,
    acc,
    ttft,
    e2e,
    state,
    out_tok,
    post_decode,
    horizon,
    pending,
    max_seqs,
    budget_tokens,
    stop_at,
    arrivals,
    waiting,
    blis,
    inputs,
    kv,
    keys,
    scratch,
    record,
    runs,
    n_runs,
    open_run,
    steps_rec,
    totals_rec,
    diag,
    kv_blocks,
    k,
    program,
    clock,
    steps,
    max_steps,
):
    """Steps in which every running request decodes one token, taken without visiting the batch
    each step, and in which a request from the waiting queue may be admitted as the ordinary step
    admits it: (steps taken, clock, step count, last duration, running requests, pending, and
    the arrival, heap, queue and run counters and earliest running deadline, brought up to date).

    The caller knows that the last step scheduled every running request and preempted none. At a
    step's start the stretch takes arrivals and ready requests as the main loop does; it ends
    before a step at whose start a deadline (`stop_at`: the batch's earliest, the waiting head's)
    has passed or whose end passes one; before a step a request's next block cannot be allocated
    in, whose duration is invalid, that would admit one of several waiting requests, or a
    request whose whole prompt is cached; after a step whose admitted request is still in
    prefill, finished, or has no room to decode in its last block; and after a step that leaves
    no request or nothing pending: the ordinary step takes it from there. A step's components
    need only the batch's context sum and maximum, which grow by the batch size and by one, and
    the admitted request's chunk. Blocks are taken in the order the ordinary step takes them: in
    a step, by the requests whose last block is full, in batch order (bucketed by the steps until
    that happens), then by the admitted request. A request's progress, tokens and E2E are brought
    up to date when it finishes or the stretch ends (from `join`, the step it began decoding in,
    and `join_dt`, the stretch's time then; 0 for the requests running at its start)."""
    block, nb, rtok, rblk, roff, ref, key, keymap, nxt, prv, head_tail, no_prompt = kv
    arrival, order, nxt_arrival, ready, heap, n_heap, deadline = arrivals
    queue, qhead, qtail, qcap, min_deadline = waiting
    members, starts, remaining, join, join_dt, gone_keys, req = scratch
    code, lits, entries, consts, comps, none, stack, local = program
    n_arr = n_running  # entries of `running` (finished ones stay until the stretch ends)
    n_live = n_running
    ctx_sum = 0.0  # a running request's context at step `done` is its base (progress - join) + done
    ctx_max = 0.0
    for j in range(block + 1):
        starts[j] = 0
    for i in range(n_running):
        r = running[i]
        remaining[i] = outputs[r] - generated[r]
        join[i] = 0
        join_dt[i] = 0
        spare = nb[r] * block - rtok[r]
        if progress[r] < inputs[r] or generated[r] < 1 or remaining[i] < 1 or spare < 0 or spare >= block:
            return 0, clock, steps, 0, n_running, pending, nxt_arrival, n_heap, qhead, qtail, min_deadline, n_runs
        c = float(progress[r])
        ctx_sum += c
        if c > ctx_max:
            ctx_max = c
        starts[spare + 1] += 1
    for j in range(block):
        starts[j + 1] += starts[j]
    for i in range(n_running):  # counting sort by spare room, keeping batch order
        r = running[i]
        spare = nb[r] * block - rtok[r]
        members[starts[spare]] = r
        starts[spare] += 1
    for j in range(block, 0, -1):
        starts[j] = starts[j - 1]
    starts[0] = 0
    next_finish = remaining[0]
    for i in range(1, n_running):
        if remaining[i] < next_finish:
            next_finish = remaining[i]
    done = 0
    total_dt = np.int64(0)
    dt = np.int64(0)  # the last step taken
    while True:
        if done > 0:  # arrivals and ready requests, as the main loop takes them at a step's start
            bad_queue_time = False
            while nxt_arrival < arrival.shape[0] and arrival[order[nxt_arrival]] <= clock:
                r = order[nxt_arrival]
                if entries[1] >= 0:
                    req[0] = inputs[r]
                    req[1] = outputs[r]
                    req[2] = dt
                    x = run_code(code, lits, entries[1], none, consts, req, stack, local)
                    if not _valid_duration(x):  # the main loop reports it
                        bad_queue_time = True
                        break
                    ready[r] = arrival[r] + max(0, int(np.round(min(x, MAX_US))))
                nxt_arrival += 1
                n_heap = _heap_push(heap, n_heap, r, ready)
            if bad_queue_time:
                break
            while n_heap > 0 and ready[heap[0]] <= clock:
                r, n_heap = _heap_pop(heap, n_heap, ready)
                state[r] = QUEUED
                queue[qtail % qcap] = r
                qtail += 1
            if qhead < qtail and deadline[queue[qhead % qcap]] < stop_at:
                stop_at = deadline[queue[qhead % qcap]]
            if clock >= stop_at:
                break
        if steps >= max_steps or (record and steps >= steps_rec.shape[0]):
            break
        j = done % block
        need = 0
        for q in range(starts[j], starts[j + 1]):
            need += state[members[q]] == RUNNING
        if need > head_tail[2]:
            break
        # the waiting head, admitted after the batch's tokens while a seat, budget and its blocks last
        admit = -1
        tok = 0
        hits = 0
        c = 0.0
        budget = budget_tokens - n_live
        if qhead < qtail and n_live < max_seqs and budget > 0:
            if qtail - qhead > 1 or n_arr >= max_seqs or (record and n_runs >= runs.shape[0]):
                break
            r = queue[qhead % qcap]
            # the blocks this step's decodes take from the free list's head lose their content first
            b = head_tail[0]
            for _q in range(need):
                if key[b] >= 0:
                    gone_keys[key[b]] = True
                b = nxt[b]
            hit_limit = inputs[r] // block if blis else (inputs[r] - 1) // block
            hits, from_free = _cached_prefix(r, hit_limit, keys, kv, gone_keys)
            b = head_tail[0]
            for _q in range(need):
                if key[b] >= 0:
                    gone_keys[key[b]] = False
                b = nxt[b]
            tok = min(inputs[r] - hits * block, budget)
            if tok <= 0:  # a fully cached prompt, admitted with no token to compute
                break
            if _ceil_div(tok, block) + from_free <= head_tail[2] - need:
                admit = r
                c = 0.0 if blis else float(hits * block)
        n_dc = float(n_live)
        dc_max = ctx_max + done
        if admit >= 0:
            v = _component_values(
                float(tok), 1.0, tok * (c + tok / 2.0), c, n_dc, ctx_sum + done * n_dc, max(dc_max, c), k
            )
        else:
            v = _component_values(0.0, 0.0, 0.0, 0.0, n_dc, ctx_sum + done * n_dc, dc_max, k)
        for q in range(comps.shape[0]):
            comps[q] = v[q]
        x = run_code(code, lits, entries[0], comps, consts, none, stack, local)
        if not _valid_duration(x) or x <= 0.0:
            break
        step_dt = max(np.int64(1), np.int64(np.round(min(x, MAX_US))))
        if clock + step_dt > stop_at:
            break
        dt = step_dt
        for q in range(starts[j], starts[j + 1]):  # whose last block is full: the next one
            r = members[q]
            if state[r] != RUNNING:
                continue
            b = head_tail[0]
            _fl_remove(b, nxt, prv, head_tail)
            if key[b] >= 0:
                keymap[key[b]] = -1
                key[b] = -1
            ref[b] = 1
            rblk[roff[r] + nb[r]] = b
            nb[r] += 1
        if admit >= 0:
            r = admit
            qhead += 1
            rtok[r] = _claim_cached(r, hits, kv, keys)
            _allocate(r, tok, True, inputs, kv, keys)
            progress[r] = hits * block
            diag[2] += hits * block
            diag[3] += inputs[r]
            state[r] = RUNNING
            running[n_arr] = r
            remaining[n_arr] = np.iinfo(np.int64).max
            if deadline[r] < min_deadline:
                min_deadline = deadline[r]
            if record:
                n_runs = _open_run(runs, n_runs, open_run, r, steps)
        if record:
            steps_rec[steps, 0] = clock
            steps_rec[steps, 1] = dt
            steps_rec[steps, 2] = kv_blocks - head_tail[2]
            steps_rec[steps, 3] = n_live + (admit >= 0)
            totals_rec[steps, 0] = float(tok) if admit >= 0 else 0.0
            totals_rec[steps, 1] = 1.0 if admit >= 0 else 0.0
            totals_rec[steps, 2] = tok * (c + tok / 2.0) if admit >= 0 else 0.0
            totals_rec[steps, 3] = c
            totals_rec[steps, 4] = n_dc
            totals_rec[steps, 5] = ctx_sum + done * n_dc
            totals_rec[steps, 6] = max(dc_max, c) if admit >= 0 else dc_max
        clock += dt
        steps += 1
        total_dt += dt
        done += 1
        if done >= next_finish:
            left_max = False
            next_finish = np.iinfo(np.int64).max
            for i in range(n_arr):  # finished by this step, in batch order
                r = running[i]
                if state[r] != RUNNING:
                    continue
                if remaining[i] > done:
                    if remaining[i] < next_finish:
                        next_finish = remaining[i]
                    continue
                base = float(progress[r] - join[i])
                s = done - join[i]
                progress[r] += s
                generated[r] += s
                rtok[r] += s
                acc[r] += total_dt - join_dt[i] + s * out_tok
                _finish(r, acc, post_decode, e2e, state, blis, inputs, kv, keys)
                if record:
                    _close_run(runs, open_run, r, steps - 1)
                if r < horizon:
                    pending -= 1
                n_live -= 1
                ctx_sum -= base
                left_max = left_max or base == ctx_max
            if left_max:
                ctx_max = -np.inf if n_live > 0 else 0.0
                for i in range(n_arr):
                    r = running[i]
                    if state[r] == RUNNING and float(progress[r] - join[i]) > ctx_max:
                        ctx_max = float(progress[r] - join[i])
        if admit >= 0:  # after the batch's requests, as the ordinary step takes it
            r = admit
            i = n_arr
            n_arr += 1
            join[i] = done
            join_dt[i] = total_dt
            progress[r] += tok
            if progress[r] < inputs[r]:
                break  # still in prefill: the ordinary step continues it
            generated[r] = 1
            ttft[r] = clock - arrival[r] + out_tok
            acc[r] = ttft[r]
            if generated[r] >= outputs[r]:
                _finish(r, acc, post_decode, e2e, state, blis, inputs, kv, keys)
                if record:
                    _close_run(runs, open_run, r, steps - 1)
                if r < horizon:
                    pending -= 1
            else:
                spare = nb[r] * block - rtok[r]
                if spare < 0 or spare >= block:
                    break
                n_live += 1
                base = float(progress[r] - done)
                ctx_sum += base
                if base > ctx_max or n_live == 1:
                    ctx_max = base
                remaining[i] = done + outputs[r] - generated[r]
                if remaining[i] < next_finish:
                    next_finish = remaining[i]
                jb = (spare + done) % block  # it needs a block at the steps done + spare (mod block)
                for q in range(starts[block], starts[jb + 1], -1):  # last of its bucket: batch order
                    members[q] = members[q - 1]
                members[starts[jb + 1]] = r
                for q in range(jb + 1, block + 1):
                    starts[q] += 1
        if pending <= 0 or n_live == 0:
            break
    m = 0
    for i in range(n_arr):
        r = running[i]
        if state[r] != RUNNING:
            continue
        s = done - join[i]
        progress[r] += s
        generated[r] += s
        rtok[r] += s
        acc[r] += total_dt - join_dt[i] + s * out_tok
        running[m] = r
        m += 1
    return done, clock, steps, dt, m, pending, nxt_arrival, n_heap, qhead, qtail, min_deadline, n_runs


@njit(cache=True, nogil=True)
def _simulate(
    arrival,
    inputs,
    outputs,
    pgroup,
    gblocks,
    goff,
    pkey,
    key_space,
    abort_after,
    max_seqs,
    budget_tokens,
    kv_blocks,
    block,
    blis,
    k,
    code,
    lits,
    entries,
    consts,
    horizon,
    max_steps,
    record,
    rows,
    traj,
    runs,
    steps_rec,
    totals_rec,
    diag,
):
    n = arrival.shape[0]
    stack = np.zeros(STACK_SIZE)
    local = np.zeros(LOCALS_SIZE)
    comps = np.zeros(N_COMPONENTS)
    req = np.zeros(3)  # the request fields queueing_time reads (dsl/program.py REQUEST_FIELDS)
    none = np.zeros(1)

    # per-program scalars
    out_tok = 0
    if entries[2] >= 0:
        x = run_code(code, lits, entries[2], none, consts, none, stack, local)
        if not _valid_duration(x):
            diag[0] = x
            diag[1] = 2.0
            return (
                BAD_QUEUE_TIME,
                0,
                0,
                -1,
                np.full(n, -1, np.int64),
                np.full(n, -1, np.int64),
                np.zeros(n, np.int8),
                np.zeros(n, np.int32),
            )
        out_tok = max(0, int(np.round(min(x, MAX_US))))
    post_decode = 0
    if entries[3] >= 0:
        x = run_code(code, lits, entries[3], none, consts, none, stack, local)
        if not _valid_duration(x):
            diag[0] = x
            diag[1] = 3.0
            return (
                BAD_QUEUE_TIME,
                0,
                0,
                -1,
                np.full(n, -1, np.int64),
                np.full(n, -1, np.int64),
                np.zeros(n, np.int8),
                np.zeros(n, np.int32),
            )
        post_decode = max(0, int(np.round(min(x, MAX_US))))
    ready = arrival.copy()
    order = np.argsort(arrival, kind="mergesort")  # arrival order
    heap = np.zeros(n, np.int64)  # arrived, waiting out their queueing time
    n_heap = 0
    last_dt = np.int64(0)  # duration of the last step started (r.last_step_us)
    deadline = arrival + abort_after

    state = np.zeros(n, np.int8)
    progress = np.zeros(n, np.int64)  # tokens computed (BLIS's ProgressIndex after the step)
    generated = np.zeros(n, np.int64)
    ttft = np.full(n, -1, np.int64)
    e2e = np.full(n, -1, np.int64)
    acc = np.zeros(n, np.int64)  # E2E accumulated so far
    preempts = np.zeros(n, np.int32)

    # KV cache (see above): per-request block lists at roff[r], the free list, content keys
    roff = np.zeros(n + 1, np.int64)
    for r in range(n):
        roff[r + 1] = roff[r] + _ceil_div(inputs[r] + outputs[r], block) + 1
    rblk = np.zeros(roff[n], np.int64)
    nb = np.zeros(n, np.int64)  # blocks held
    rtok = np.zeros(n, np.int64)  # tokens stored in them
    no_prompt = np.zeros(n, np.bool_)  # admitted with its whole prompt cached and unclaimed (BLIS): blocks hold outputs
    keymap = np.full(key_space, -1, np.int64)  # content key -> block holding it
    key = np.full(kv_blocks, -1, np.int64)  # block -> the content key it holds
    ref = np.zeros(kv_blocks, np.int64)
    nxt = np.arange(1, kv_blocks + 1, dtype=np.int64)
    nxt[kv_blocks - 1] = -1
    prv = np.arange(-1, kv_blocks - 1, dtype=np.int64)
    head_tail = np.array([0, kv_blocks - 1, kv_blocks], np.int64)  # free list head, tail, length
    kv = (block, nb, rtok, rblk, roff, ref, key, keymap, nxt, prv, head_tail, no_prompt)
    keys = (pgroup, gblocks, goff, pkey)

    qcap = 2 * n + 2  # waiting deque as a ring buffer
    queue = np.zeros(qcap, np.int64)
    qhead = n + 1
    qtail = n + 1
    running = np.zeros(max_seqs, np.int64)
    n_running = 0
    sched = np.zeros(max_seqs, np.int64)  # tokens given this step, by batch position
    pending = min(horizon, n)  # horizon requests not yet finished or timed out
    nxt_arrival = 0
    min_deadline = NO_DEADLINE  # earliest client deadline among running requests (may be stale-low)
    clock = np.int64(0)
    steps = 0
    n_rec = 0
    n_runs = 0
    open_run = np.full(n if record else 0, -1, np.int64)  # each request's open run of steps (index into runs; -1: none)
    unopened = 0  # running requests without an open run (see _open_run)
    all_decode = False  # the last step scheduled every running request and preempted none
    members = np.zeros(max_seqs, np.int64)  # _decode_stretch's buckets
    remaining = np.zeros(max_seqs, np.int64)  # and each running request's steps to its last token
    starts = np.zeros(block + 1, np.int64)
    join = np.zeros(max_seqs, np.int64)  # the stretch step each running request began decoding in
    join_dt = np.zeros(max_seqs, np.int64)  # and the stretch's time then
    gone_keys = np.zeros(key_space, np.bool_)  # content keys a step's decodes evict (see _decode_stretch)

    while pending > 0:
        while nxt_arrival < n and arrival[order[nxt_arrival]] <= clock:
            r = order[nxt_arrival]
            nxt_arrival += 1
            if entries[1] >= 0:
                req[0] = inputs[r]
                req[1] = outputs[r]
                req[2] = last_dt
                x = run_code(code, lits, entries[1], none, consts, req, stack, local)
                if not _valid_duration(x):
                    diag[0] = x
                    diag[1] = 1.0
                    return BAD_QUEUE_TIME, steps, clock, r, ttft, e2e, state, preempts
                ready[r] = arrival[r] + max(0, int(np.round(min(x, MAX_US))))
            n_heap = _heap_push(heap, n_heap, r, ready)
        while n_heap > 0 and ready[heap[0]] <= clock:
            r, n_heap = _heap_pop(heap, n_heap, ready)
            state[r] = QUEUED
            queue[qtail % qcap] = r
            qtail += 1
        # client timeouts among running requests (waiting ones are dropped at the head); the
        # batch is scanned only once the earliest running deadline has passed
        if min_deadline <= clock:
            m = 0
            min_deadline = NO_DEADLINE
            for i in range(n_running):
                r = running[i]
                if deadline[r] <= clock:
                    state[r] = TIMED_OUT
                    unopened = _leave(runs, open_run, r, steps - 1, unopened)
                    _release(r, kv)
                    if r < horizon:
                        pending -= 1
                else:
                    running[m] = r
                    m += 1
                    if deadline[r] < min_deadline:
                        min_deadline = deadline[r]
            n_running = m
        while qhead < qtail and deadline[queue[qhead % qcap]] <= clock:
            r = queue[qhead % qcap]
            qhead += 1
            state[r] = TIMED_OUT
            if r < horizon:
                pending -= 1
        if pending <= 0:
            break
        if n_running == 0 and qhead == qtail:
            if nxt_arrival < n or n_heap > 0:
                clock = max(clock, _next_event(NO_DEADLINE, arrival, order, nxt_arrival, ready, heap, n_heap))
                continue
            break

        if (
            all_decode
            and not rows
            and (unopened == 0 or not record)
            and 0 < n_running <= budget_tokens
            and (qtail - qhead <= 1 or n_running >= max_seqs)
        ):
            stop_at = min_deadline
            if qhead < qtail and deadline[queue[qhead % qcap]] < stop_at:
                stop_at = deadline[queue[qhead % qcap]]
            (done, clock, steps, dt, n_running, pending, nxt_arrival, n_heap, qhead, qtail, min_deadline, n_runs) = (
                _decode_stretch(
                    running,
                    n_running,
                    progress,
                    generated,
                    outputs,
                    acc,
                    ttft,
                    e2e,
                    state,
                    out_tok,
                    post_decode,
                    horizon,
                    pending,
                    max_seqs,
                    budget_tokens,
                    stop_at,
                    (arrival, order, nxt_arrival, ready, heap, n_heap, deadline),
                    (queue, qhead, qtail, qcap, min_deadline),
                    blis,
                    inputs,
                    kv,
                    keys,
                    (members, starts, remaining, join, join_dt, gone_keys, req),
                    record,
                    runs,
                    n_runs,
                    open_run,
                    steps_rec,
                    totals_rec,
                    diag,
                    kv_blocks,
                    k,
                    (code, lits, entries, consts, comps, none, stack, local),
                    clock,
                    steps,
                    max_steps,
                )
            )
            if done > 0:
                last_dt = dt
                diag[5] += done
                continue

        # 2. running requests in batch order (batch totals for the components accumulate as
        # requests get their tokens; c is the context already in the KV cache)
        budget = budget_tokens
        preempted = False
        admitted_empty = False  # a fully cached prompt admitted with no token to compute (BLIS)
        tok_pf = 0.0
        n_pf = 0.0
        pf_pairs = 0.0
        pf_ctx = 0.0
        n_dc = 0.0
        dc_ctx = 0.0
        ctx_max = 0.0
        i = 0
        while i < n_running and budget > 0:
            r = running[i]
            if progress[r] < inputs[r]:
                tok = min(inputs[r] - progress[r], budget)
            else:
                tok = 1
            self_preempted = False
            spare = nb[r] * block - rtok[r]
            need = 0 if tok <= spare else _ceil_div(tok - spare, block)
            while need > head_tail[2]:
                victim = running[n_running - 1]
                n_running -= 1
                unopened = _leave(runs, open_run, victim, steps - 1, unopened)
                _release(victim, kv)
                progress[victim] = 0
                generated[victim] = 0
                ttft[victim] = -1
                acc[victim] = 0
                preempts[victim] += 1
                state[victim] = QUEUED
                qhead -= 1
                queue[qhead % qcap] = victim
                preempted = True
                if victim == r:
                    self_preempted = True
                    break
            if self_preempted:
                break
            if need == 0 and (rtok[r] + tok < nb[r] * block or nb[r] * block > inputs[r] or no_prompt[r]):
                rtok[r] += tok  # fits in the last block, which stays partial or holds output tokens (no key)
            else:
                _allocate(r, tok, progress[r] < inputs[r], inputs, kv, keys)
            sched[i] = tok
            budget -= tok
            c = float(progress[r])
            if progress[r] < inputs[r]:
                tok_pf += tok
                n_pf += 1.0
                pf_pairs += tok * (c + tok / 2.0)
                pf_ctx += c
            else:
                n_dc += 1.0
                dc_ctx += c
            if c > ctx_max:
                ctx_max = c
            if record and unopened > 0 and open_run[r] < 0:
                n_runs = _open_run(runs, n_runs, open_run, r, steps)
                unopened -= 1
                if n_runs < 0:
                    return TRAJECTORY_FULL, steps, clock, -1, ttft, e2e, state, preempts
            if rows:
                if n_rec >= traj.shape[0]:
                    return TRAJECTORY_FULL, steps, clock, -1, ttft, e2e, state, preempts
                _record_slot(traj, n_rec, steps, tok, progress[r], progress[r] < inputs[r], r)
                n_rec += 1
            i += 1
        all_decode = not preempted and i == n_running  # (whether all decode next step, _decode_stretch checks)
        for j in range(i, n_running):  # skipped this step (the budget ran out)
            sched[j] = 0
            if record:
                unopened += _close_run(runs, open_run, running[j], steps - 1)

        # 3. admission from the waiting queue, only when nothing was preempted
        if not preempted:
            while n_running < max_seqs and budget > 0 and qhead < qtail:
                r = queue[qhead % qcap]
                if deadline[r] <= clock:
                    qhead += 1
                    state[r] = TIMED_OUT
                    if r < horizon:
                        pending -= 1
                    continue
                # prompt blocks already cached; vLLM always computes the prompt's last token, BLIS need not
                hit_limit = inputs[r] // block if blis else (inputs[r] - 1) // block
                hits, from_free = _cached_prefix(r, hit_limit, keys, kv, gone_keys)
                start = hits * block
                tok = min(inputs[r] - start, budget)
                if _ceil_div(tok, block) + from_free > head_tail[2]:
                    break
                qhead += 1
                if tok > 0:  # BLIS claims cached blocks only along with new tokens
                    rtok[r] = _claim_cached(r, hits, kv, keys)
                    _allocate(r, tok, True, inputs, kv, keys)
                else:
                    admitted_empty = True
                    no_prompt[r] = True
                progress[r] = start
                diag[2] += start  # prompt tokens served from the cache, of diag[3] admitted
                diag[3] += inputs[r]
                state[r] = RUNNING
                running[n_running] = r
                sched[n_running] = tok
                n_running += 1
                budget -= tok
                if deadline[r] < min_deadline:
                    min_deadline = deadline[r]
                if tok == 0:
                    unopened += 1
                    continue
                # BLIS passes the admitted request with its progress index still 0: no context
                c = 0.0 if blis else float(start)
                tok_pf += tok  # a newly admitted request is always in prefill
                n_pf += 1.0
                pf_pairs += tok * (c + tok / 2.0)
                pf_ctx += c
                if c > ctx_max:
                    ctx_max = c
                if record:
                    n_runs = _open_run(runs, n_runs, open_run, r, steps)
                    if n_runs < 0 or (rows and n_rec >= traj.shape[0]):
                        return TRAJECTORY_FULL, steps, clock, -1, ttft, e2e, state, preempts
                    if rows:
                        _record_slot(traj, n_rec, steps, tok, int(c), True, r)
                        n_rec += 1

        if budget == budget_tokens and not admitted_empty:
            # nothing could be scheduled (a head that never fits): wait for the next event
            nxt_event = deadline[queue[qhead % qcap]] if qhead < qtail else clock + 1
            clock = max(clock + 1, _next_event(nxt_event, arrival, order, nxt_arrival, ready, heap, n_heap))
            continue

        # 4. the step: components from the batch totals, then the program
        v = _component_values(tok_pf, n_pf, pf_pairs, pf_ctx, n_dc, dc_ctx, ctx_max, k)
        for j in range(N_COMPONENTS):
            comps[j] = v[j]
        x = run_code(code, lits, entries[0], comps, consts, none, stack, local)
        if not _valid_duration(x) or x <= 0.0:
            diag[0] = x
            return BAD_STEP_TIME, steps, clock, -1, ttft, e2e, state, preempts
        dt = max(np.int64(1), np.int64(np.round(min(x, MAX_US))))
        last_dt = dt
        if record:
            if steps >= steps_rec.shape[0]:
                return TRAJECTORY_FULL, steps, clock, -1, ttft, e2e, state, preempts
            steps_rec[steps, 0] = clock
            steps_rec[steps, 1] = dt
            steps_rec[steps, 2] = kv_blocks - head_tail[2]
            steps_rec[steps, 3] = n_running
            totals_rec[steps, 0] = tok_pf
            totals_rec[steps, 1] = n_pf
            totals_rec[steps, 2] = pf_pairs
            totals_rec[steps, 3] = pf_ctx
            totals_rec[steps, 4] = n_dc
            totals_rec[steps, 5] = dc_ctx
            totals_rec[steps, 6] = ctx_max
        clock += dt
        steps += 1
        if steps > max_steps:
            return STEP_LIMIT, steps, clock, -1, ttft, e2e, state, preempts

        # 5. advance progress, emit tokens, finish; a client that gave up during the step takes
        # its request away (BLIS runs a step at its start, so a request the step finishes is done)
        m = 0
        for j in range(n_running):
            r = running[j]
            tok = sched[j]
            empty_admit = tok == 0 and progress[r] >= inputs[r] and generated[r] == 0
            if tok > 0 or empty_admit:
                gave_up = clock > deadline[r]
                if gave_up and not blis:
                    state[r] = TIMED_OUT
                    unopened = _leave(runs, open_run, r, steps - 1, unopened)
                    _release(r, kv)
                    if r < horizon:
                        pending -= 1
                    continue
                if progress[r] < inputs[r] or empty_admit:
                    progress[r] += tok
                    if progress[r] >= inputs[r]:
                        generated[r] = 1
                        ttft[r] = clock - arrival[r] + out_tok
                        acc[r] = ttft[r]
                else:
                    progress[r] += 1
                    generated[r] += 1
                    acc[r] += dt + out_tok
                if generated[r] >= outputs[r]:
                    _finish(r, acc, post_decode, e2e, state, blis, inputs, kv, keys)
                    unopened = _leave(runs, open_run, r, steps - 1, unopened)
                    if r < horizon:
                        pending -= 1
                    continue
                if gave_up:
                    state[r] = TIMED_OUT
                    unopened = _leave(runs, open_run, r, steps - 1, unopened)
                    _release(r, kv)
                    if r < horizon:
                        pending -= 1
                    continue
            running[m] = r
            m += 1
        n_running = m
    for r in range(open_run.shape[0]):  # runs still open were scheduled up to the last step
        _close_run(runs, open_run, r, steps - 1)
    diag[4] = n_runs  # runs of consecutive steps recorded
    return OK, steps, clock, n_rec, ttft, e2e, state, preempts


@dataclass
class Trajectory:
    """Scheduled request-slots of every step (flat; None when replayed with rows=False), each
    request's runs of consecutive scheduled steps, and each step's start and duration (us)."""

    step: np.ndarray | None
    new_tokens: np.ndarray | None
    context: np.ndarray | None
    is_prefill: np.ndarray | None
    request: np.ndarray | None
    runs: np.ndarray  # (k, 3): request, first step, last step of each run (in the order they opened)
    step_start_us: np.ndarray
    step_us: np.ndarray
    kv_blocks_used: np.ndarray  # after the step's allocations
    running: np.ndarray  # requests in the running batch during the step
    totals: (
        np.ndarray
    )  # (steps, 7): the batch totals component_values takes (tok_pf, n_pf, pf_pairs, pf_ctx, n_dc, dc_ctx, ctx_max)

    @property
    def n_steps(self) -> int:
        return len(self.step_us)


@dataclass
class ReplayResult:
    status: int
    n_steps: int
    clock_us: int
    ttft_us: np.ndarray  # -1 where no first token
    e2e_us: np.ndarray  # -1 where not finished
    state: np.ndarray
    preemptions: np.ndarray
    trajectory: Trajectory | None = None
    bad_value: float = 0.0  # the offending value when status is BAD_STEP_TIME or BAD_QUEUE_TIME
    bad_function: str = "step_time"
    cached_tokens: int = 0  # prompt tokens the prefix cache served at admissions (re-admissions after preemption too)
    admitted_prompt_tokens: int = 0  # prompt tokens of those admissions
    stretch_steps: int = 0  # steps taken as decode stretches (_decode_stretch), without visiting the batch

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.admitted_prompt_tokens if self.admitted_prompt_tokens else 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK

    def failure(self) -> str:
        """One line saying what went wrong (empty when the replay succeeded)."""
        return {
            OK: "",
            BAD_STEP_TIME: f"step_time returned {self.bad_value:g} (must be finite, positive and at most {MAX_US:g} us) at step {self.n_steps}",
            STEP_LIMIT: f"simulation exceeded the step limit ({self.n_steps} steps)",
            BAD_QUEUE_TIME: f"{self.bad_function} returned {self.bad_value:g} (must be finite and at most {MAX_US:g} us)",
            TRAJECTORY_FULL: "trajectory buffer full",
        }[self.status]


_COEF_CACHE: dict[tuple, np.ndarray] = {}


def experiment_coefficients(exp: Experiment) -> np.ndarray:
    key = (exp.arch, exp.hardware, exp.tp)  # by value: experiment objects come and go (windowed copies)
    if key not in _COEF_CACHE:
        _COEF_CACHE[key] = coefficients(exp.arch, exp.hardware, exp.tp)
    return _COEF_CACHE[key]


def key_layout(exp: Experiment) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The prefix cache's content keys for `exp` (see above): per group its blocks and first key,
    per request the first key of its prompt's own blocks, and how many keys there are. Requests
    that sent one prompt share its keys; each prompt has room for its full prompt blocks."""
    block = exp.server.block_size
    gblocks = np.array([t // block for t in exp.group_tokens] or [0], dtype=np.int64)
    goff = np.concatenate(([0], np.cumsum(gblocks)[:-1])).astype(np.int64)
    n_group_keys = int(gblocks.sum())
    which, ids = pd.factorize(exp.prompt, sort=True)  # np.unique(return_inverse=True)'s labels, faster
    room = np.zeros(len(ids), dtype=np.int64)
    np.maximum.at(room, which, exp.input_tokens // block + 1)
    poff = np.concatenate(([0], np.cumsum(room)))
    return gblocks, goff, (n_group_keys + poff[which]).astype(np.int64), int(n_group_keys + poff[-1])


def replay(
    exp: Experiment,
    program: CompiledProgram,
    constants,
    horizon: int | None = None,
    record: bool = False,
    max_steps: int = 50_000_000,
    semantics: str = DEFAULT_SEMANTICS,
    rows: bool = True,
) -> ReplayResult:
    """Replay `exp` closed-loop with `program` at `constants` (array in program order).

    horizon: stop once every request at arrival position < horizon finished or timed out
    (requests after it still arrive and compete until then). record: keep the trajectory;
    rows=False keeps it without its request-slot rows (one per scheduled request per step, tens
    of millions on the real data), only the steps and each request's runs of steps.
    semantics: "blis" (as BLIS accounts a step, so fitted constants mean the same in the
    simulator) or "vllm" (see SEMANTICS).
    """
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {', '.join(SEMANTICS)}, not {semantics!r}")
    n = exp.n_requests
    horizon = n if horizon is None else int(min(max(horizon, 0), n))
    rows = rows and record  # rows are part of a recording
    consts = np.ascontiguousarray(constants, dtype=np.float64)
    if consts.shape != (len(program.constant_names),):
        raise ValueError(f"expected {len(program.constant_names)} constants, got shape {consts.shape}")
    s = exp.server
    layout = key_layout(exp)
    # trajectory buffers sized for every output token plus a prefill chunk per request, runs for
    # a few (re)admissions per request (grown on overflow)
    cap = int(exp.output_tokens.sum()) + 4 * n + 1024 if record else 1
    run_cap = 4 * n + 1024 if record else 1
    while True:
        traj = np.zeros((cap if rows else 1, 5), np.int64)
        runs = np.zeros((run_cap, 3), np.int64)
        steps_rec = np.zeros((cap, 4), np.int64)
        totals_rec = np.zeros((cap, 7))
        diag = np.zeros(6)
        status, steps, clock, n_rec, ttft, e2e, state, pre = _simulate(
            exp.arrival_us,
            exp.input_tokens,
            exp.output_tokens,
            exp.prefix_group,
            *layout,
            exp.abort_after_us,
            s.max_num_seqs,
            s.max_num_batched_tokens,
            s.kv_blocks,
            s.block_size,
            semantics == "blis",
            experiment_coefficients(exp),
            program.code,
            program.literals,
            program.entries,
            consts,
            horizon,
            max_steps,
            record,
            rows,
            traj,
            runs,
            steps_rec,
            totals_rec,
            diag,
        )
        if status != TRAJECTORY_FULL:
            break
        cap, run_cap = max(cap * 4, 1 << 20), run_cap * 4
    trajectory = None
    if record and status == OK:
        t = traj[:n_rec] if rows else None
        trajectory = Trajectory(
            step=t[:, 0] if rows else None,
            new_tokens=t[:, 1] if rows else None,
            context=t[:, 2] if rows else None,
            is_prefill=t[:, 3].astype(bool) if rows else None,
            request=t[:, 4] if rows else None,
            runs=runs[: int(diag[4])],
            step_start_us=steps_rec[:steps, 0],
            step_us=steps_rec[:steps, 1],
            kv_blocks_used=steps_rec[:steps, 2],
            running=steps_rec[:steps, 3],
            totals=totals_rec[:steps],
        )
    which = {1: "queueing_time", 2: "output_token_time", 3: "post_decode_time"}.get(int(diag[1]), "step_time")
    return ReplayResult(
        int(status),
        int(steps),
        int(clock),
        ttft,
        e2e,
        state,
        pre,
        trajectory,
        float(diag[0]),
        which,
        int(diag[2]),
        int(diag[3]),
        int(diag[5]),
    )
