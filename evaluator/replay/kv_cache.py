"""The replay's KV cache: blocks with reference counts, a free list in LRU order and prefix
hashes, and a finishing request's release (numba)."""

from __future__ import annotations

from numba import njit

from stepml_evolve.evaluator.replay.state import FINISHED

# ---- the KV cache: blocks with reference counts, a free list in LRU order, prefix hashes ----
# As in vLLM and BLIS (sim/kv/cache.go): a request holds a list of blocks; blocks it releases go
# to the tail of the free list in reverse order and keep their content, so a later request (or
# the same one, readmitted after a preemption) whose prompt starts with that content hits them
# until a new allocation pops them from the head and overwrites them. Content identity stands in
# for the block hash (data/experiments.py, data/prompt_reuse.py): block i < gblocks[g] of a request in
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
