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

import inspect
from collections import namedtuple

import numpy as np
from numba import njit

from stepml_evolve.evaluator.dsl.vm import LOCALS_SIZE, STACK_SIZE, run_code
from stepml_evolve.evaluator.hardware.components import N_COMPONENTS
from stepml_evolve.evaluator.replay.decode_stretch import _decode_stretch
from stepml_evolve.evaluator.replay.kv_cache import _allocate, _cached_prefix, _claim_cached, _finish, _release
from stepml_evolve.evaluator.replay.state import (
    BAD_QUEUE_TIME,
    BAD_STEP_TIME,
    BELOW_FLOOR,
    DIAG_ADMITTED,
    DIAG_CACHED,
    DIAG_CTX_MAX,
    DIAG_FLOOR,
    DIAG_FUNCTION,
    DIAG_N_DC,
    DIAG_N_PF,
    DIAG_RUNS,
    DIAG_STRETCH,
    DIAG_TOK_PF,
    DIAG_VALUE,
    MAX_US,
    NO_DEADLINE,
    OK,
    QUEUED,
    RUNNING,
    STEP_LIMIT,
    TIMED_OUT,
    TRAJECTORY_FULL,
    _below_floor,
    _ceil_div,
    _close_run,
    _component_values,
    _heap_pop,
    _heap_push,
    _leave,
    _next_event,
    _open_run,
    _record_slot,
    _valid_duration,
)

_STRETCH = list(inspect.signature(_decode_stretch.py_func).parameters)
# What _decode_stretch takes besides its counters, as one bundle: its parameters after n_runs
Work = namedtuple("Work", _STRETCH[_STRETCH.index("n_runs") + 1 :])


@njit(cache=True, nogil=True)
def _simulate(
    # the requests, and their prompts' content keys (pgroup, gblocks, goff, pkey: closed_loop.key_layout)
    arrival,
    inputs,
    outputs,
    abort_after,
    keys,
    key_space,
    # the server, and the semantics (blis or vllm, state.py)
    max_seqs,
    budget_tokens,
    kv_blocks,
    block,
    blis,
    # the program: the components' coefficients, its code and constants, the floor check
    k,
    code,
    lits,
    entries,
    consts,
    floor_check,
    # how far to go and what to record
    horizon,
    max_steps,
    record,
    rows,
    # written: each request's outcome (given as -1, -1, 0, 0), the recording and diag (DIAG_*)
    ttft,
    e2e,
    state,
    preempts,
    traj,
    runs,
    steps_rec,
    totals_rec,
    diag,
):
    """Replay the requests: (status, steps, clock, request-slot rows recorded); the rest is
    written into the arrays given."""
    n = arrival.shape[0]
    stack = np.zeros(STACK_SIZE)
    local = np.zeros(LOCALS_SIZE)
    comps = np.zeros(N_COMPONENTS)
    req = np.zeros(3)  # the request fields queueing_time reads (dsl/program.py REQUEST_FIELDS)
    none = np.zeros(1)

    # per-program scalars: output_token_time and post_decode_time
    scalars = np.zeros(2, np.int64)
    for j in range(2):
        if entries[2 + j] >= 0:
            x = run_code(code, lits, entries[2 + j], none, consts, none, stack, local)
            if not _valid_duration(x) or x < 0.0:
                diag[DIAG_VALUE] = x
                diag[DIAG_FUNCTION] = 2.0 + j
                return BAD_QUEUE_TIME, 0, 0, -1
            scalars[j] = max(0, int(np.round(min(x, MAX_US))))
    out_tok, post_decode = scalars[0], scalars[1]
    ready = arrival.copy()
    order = np.argsort(arrival, kind="mergesort")  # arrival order
    heap = np.zeros(n, np.int64)  # arrived, waiting out their queueing time
    n_heap = 0
    last_dt = np.int64(0)  # duration of the last step started (r.last_step_us)
    deadline = arrival + abort_after

    progress = np.zeros(n, np.int64)  # tokens computed (BLIS's ProgressIndex after the step)
    generated = np.zeros(n, np.int64)
    acc = np.zeros(n, np.int64)  # E2E accumulated so far

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
    gone_keys = np.zeros(key_space, np.bool_)  # content keys a step's decodes evict (see _decode_stretch)
    w = Work(
        arrival=arrival,
        inputs=inputs,
        outputs=outputs,
        keys=keys,
        max_seqs=max_seqs,
        budget_tokens=budget_tokens,
        kv_blocks=kv_blocks,
        blis=blis,
        k=k,
        code=code,
        lits=lits,
        entries=entries,
        consts=consts,
        floor_check=floor_check,
        horizon=horizon,
        max_steps=max_steps,
        record=record,
        ttft=ttft,
        e2e=e2e,
        state=state,
        runs=runs,
        steps_rec=steps_rec,
        totals_rec=totals_rec,
        diag=diag,
        out_tok=out_tok,
        post_decode=post_decode,
        deadline=deadline,
        running=running,
        progress=progress,
        generated=generated,
        acc=acc,
        open_run=open_run,
        order=order,
        ready=ready,
        heap=heap,
        queue=queue,
        qcap=qcap,
        members=np.zeros(max_seqs, np.int64),  # _decode_stretch's buckets
        starts=np.zeros(block + 1, np.int64),
        remaining=np.zeros(max_seqs, np.int64),  # and each running request's steps to its last token
        join=np.zeros(max_seqs, np.int64),  # the stretch step each running request began decoding in
        join_dt=np.zeros(max_seqs, np.int64),  # and the stretch's time then
        gone_keys=gone_keys,
        kv=kv,
        req=req,
        comps=comps,
        none=none,
        stack=stack,
        local=local,
    )

    while pending > 0:
        while nxt_arrival < n and arrival[order[nxt_arrival]] <= clock:
            r = order[nxt_arrival]
            nxt_arrival += 1
            if entries[1] >= 0:
                req[0] = inputs[r]
                req[1] = outputs[r]
                req[2] = last_dt
                x = run_code(code, lits, entries[1], none, consts, req, stack, local)
                if not _valid_duration(x) or x < 0.0:
                    diag[DIAG_VALUE] = x
                    diag[DIAG_FUNCTION] = 1.0
                    return BAD_QUEUE_TIME, steps, clock, -1
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
            counters = (clock, steps, n_running, pending, nxt_arrival, n_heap, qhead, qtail, min_deadline, n_runs)
            done, dt, clock, steps, n_running, pending, nxt_arrival, n_heap, qhead, qtail, min_deadline, n_runs = (
                _decode_stretch(*(counters + w[:]))  # w[:]: the bundle as a plain tuple, which numba can join
            )
            if done > 0:
                last_dt = dt
                diag[DIAG_STRETCH] += done
                continue

        # a step records at most one row and opens at most one run per seat, and one row of steps:
        # with less room than that left, closed_loop replays again with larger buffers
        if record and (
            steps >= steps_rec.shape[0]
            or n_runs + max_seqs > runs.shape[0]
            or (rows and n_rec + max_seqs > traj.shape[0])
        ):
            return TRAJECTORY_FULL, steps, clock, -1

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
            if rows:
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
                diag[DIAG_CACHED] += start  # prompt tokens served from the cache, of diag[DIAG_ADMITTED] admitted
                diag[DIAG_ADMITTED] += inputs[r]
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
            diag[DIAG_VALUE] = x
            return BAD_STEP_TIME, steps, clock, -1
        floor = _below_floor(x, v) if floor_check else 0.0
        if floor > 0.0:
            diag[DIAG_VALUE] = x
            diag[DIAG_FLOOR] = floor
            diag[DIAG_TOK_PF] = tok_pf
            diag[DIAG_N_PF] = n_pf
            diag[DIAG_N_DC] = n_dc
            diag[DIAG_CTX_MAX] = ctx_max
            return BELOW_FLOOR, steps, clock, -1
        dt = max(np.int64(1), np.int64(np.round(min(x, MAX_US))))
        last_dt = dt
        if record:
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
            return STEP_LIMIT, steps, clock, -1

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
    diag[DIAG_RUNS] = n_runs  # runs of consecutive steps recorded
    return OK, steps, clock, n_rec


# One replay's arrays and settings, as one bundle: _simulate's parameters (closed_loop.replay makes
# one by name and passes it as _simulate(*sim))
Simulation = namedtuple("Simulation", inspect.signature(_simulate.py_func).parameters)
