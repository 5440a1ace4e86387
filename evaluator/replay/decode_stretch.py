"""Steps in which the batch only decodes (and admits a lone arrival), taken without visiting the
batch (docs/concepts/design-notes.md) (numba)."""

from __future__ import annotations

import numpy as np
from numba import njit

from stepml_evolve.evaluator.dsl.vm import run_code
from stepml_evolve.evaluator.replay.kv_cache import _allocate, _cached_prefix, _claim_cached, _finish, _fl_remove
from stepml_evolve.evaluator.replay.state import (
    DIAG_ADMITTED,
    DIAG_CACHED,
    MAX_US,
    QUEUED,
    RUNNING,
    _below_floor,
    _ceil_div,
    _close_run,
    _component_values,
    _heap_pop,
    _heap_push,
    _open_run,
    _valid_duration,
)


@njit(cache=True, nogil=True)
def _decode_stretch(
    # the counters, brought up to date in the result
    clock,
    steps,
    n_running,
    pending,
    nxt_arrival,
    n_heap,
    qhead,
    qtail,
    min_deadline,
    n_runs,
    # the rest is scheduler.Work: _simulate's settings and arrays
    arrival,
    inputs,
    outputs,
    keys,
    max_seqs,
    budget_tokens,
    kv_blocks,
    blis,
    k,
    code,
    lits,
    entries,
    consts,
    floor_check,
    horizon,
    max_steps,
    record,
    ttft,
    e2e,
    state,
    runs,
    steps_rec,
    totals_rec,
    diag,
    # and its working arrays
    out_tok,
    post_decode,
    deadline,
    running,
    progress,
    generated,
    acc,
    open_run,
    order,
    ready,
    heap,
    queue,
    qcap,
    members,
    starts,
    remaining,
    join,
    join_dt,
    gone_keys,
    kv,
    req,
    comps,
    none,
    stack,
    local,
):
    """Steps in which every running request decodes one token, taken without visiting the batch
    each step, and in which a request from the waiting queue may be admitted as the ordinary step
    admits it: (steps taken, last duration, and the counters brought up to date: clock, step count,
    running requests, pending, the arrival, heap and queue counters, the earliest running deadline,
    the count of runs).

    The caller knows that the last step scheduled every running request and preempted none. At a
    step's start the stretch takes arrivals and ready requests as the main loop does; it ends
    before a step at whose start a deadline (`stop_at`: the batch's earliest, the waiting head's)
    has passed or whose end passes one; before a step a request's next block cannot be allocated
    in, whose duration is invalid (or below the floor, when the replay checks it), that would admit one of several waiting requests, or a
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
    stop_at = min_deadline
    if qhead < qtail and deadline[queue[qhead % qcap]] < stop_at:
        stop_at = deadline[queue[qhead % qcap]]
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
            return 0, 0, clock, steps, n_running, pending, nxt_arrival, n_heap, qhead, qtail, min_deadline, n_runs
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
                    if not _valid_duration(x) or x < 0.0:  # the main loop reports it
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
        if not _valid_duration(x) or x <= 0.0 or (floor_check and _below_floor(x, v) > 0.0):
            break  # the step is taken (and the replay stopped) where the main loop says why
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
            diag[DIAG_CACHED] += hits * block
            diag[DIAG_ADMITTED] += inputs[r]
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
    return done, dt, clock, steps, m, pending, nxt_arrival, n_heap, qhead, qtail, min_deadline, n_runs
