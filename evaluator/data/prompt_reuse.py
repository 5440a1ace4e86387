"""Which prompt each request sent: the workload model behind the replay's prefix-cache hits.

vLLM's prefix cache hashes full KV blocks by content (chained: a block's hash covers every token
before it), so what a request finds cached depends on which earlier requests sent the same
tokens. The data rarely record that; this module decides it, per `--prompt-reuse` policy:

  * detect (default): the load generator of the real runs (inference-perf's shared-prefix data)
    pre-generates a fixed list of prompts, each a system prompt of its group followed by a
    question, and sends them in turn, so request i sends prompt i % P. The per-request input
    lengths then repeat with period P. `detect_cycle` finds P from the lengths alone (the share
    of requests whose length equals that of the request P later, against the share two random
    requests would match by chance); `assign_prompts` gives each request its prompt: the one of
    its slot (i % P) when its length is that prompt's, a neighbouring slot's when two sends
    swapped places on the way (asynchronous sends arrive out of order now and then), else a
    prompt of its own (counted as unmatched). A failed request records no length; it gets its
    slot's prompt and length. Prompts of one system-prompt group share the system prompt's full
    blocks; prompts are dealt to groups in turn (prompt p in group p % G), which the data cannot
    confirm (they record no group) and which matters only for a prompt's first send and after
    its own blocks were evicted. Data whose lengths show no cycle fall back to system-prompt.
  * system-prompt: only the system prompt is shared; request i is in group i % G and its
    question is its own (the replay's model before cycles were detected).
  * off: nothing is shared (every prompt computed in full, as with prefix caching off).

Data that record per-request groups (`prefix_group` / `prefix_length`, e.g. imported from a BLIS
trace) are replayed as recorded under detect and system-prompt; each group has its own length.

What the replay keys blocks by (`Sharing`): per request its prompt id (equal ids: identical
prompts, so every full block is shared) and its group (-1: none), per group the tokens its
prompts share. The first `group_tokens[g] // block` blocks of a grouped request are the group's,
the others its prompt's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

POLICIES = ("detect", "system-prompt", "off")
DEFAULT_POLICY = POLICIES[0]
LEGACY_POLICY = "system-prompt"  # what runs, fits and archives from before the policy existed replayed
# a cycle is declared when its period's match share is at least MIN_SHARE and beats both chance and
# the share at lag 1 by MIN_EXCESS of what chance leaves (lengths in constant stretches match their
# neighbours: that is no list sent in turn); the period is the shortest such lag that its multiples
# do not beat by more than PERIOD_TOLERANCE (they match as well; a lag that is a fraction of the
# period would match much less than its multiples).
MIN_SHARE = 0.8
MIN_EXCESS = 0.6
PERIOD_TOLERANCE = 0.1
MIN_ROUNDS = 2  # the data must hold at least this many sends of the list
MAX_PERIOD = 5000
NEIGHBOURS = (1, -1, 2, -2, 3, -3)  # slots a swapped send is looked for in, nearest first


@dataclass(frozen=True)
class Cycle:
    period: int
    share: float  # share of pairs (i, i + period) of known lengths that match
    chance: float  # share two requests' lengths match by chance


@dataclass(frozen=True)
class Sharing:
    """The prompt structure the replay keys KV blocks by."""

    prompt: np.ndarray  # int64 per request: equal ids sent identical prompts
    group: np.ndarray  # int64 per request: its shared-prefix group, -1 for none
    group_tokens: tuple[int, ...]  # per group: the tokens its requests share

    @classmethod
    def none(cls, n: int) -> Sharing:
        return cls(np.arange(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), ())


@dataclass(frozen=True)
class ReuseReport:
    """What the loader decided about prompt reuse (shown by `evolve data check`)."""

    policy: str  # the --prompt-reuse policy asked for
    model: str  # what the replay does: cycle, recorded, system-prompt or none
    period: int | None = None  # the cycle's length (distinct prompts sent in turn)
    share_matched: float | None = None  # of requests with a recorded length: share at their slot's prompt
    n_prompts: int = 0  # distinct shared prompts (cycle) or groups (recorded, system-prompt)
    n_swapped: int = 0  # requests matched to a neighbouring slot's prompt
    n_unmatched: int = 0  # requests whose length fits no nearby prompt: replayed with a prompt of their own
    n_imputed: int = 0  # requests without a recorded length given their slot's prompt
    cached_share: float = 0.0  # share of prompt tokens a cache that never evicts would serve (vLLM's rule)
    note: str = ""

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def match_share(lengths: np.ndarray, known: np.ndarray, lag: int) -> float:
    """Of the pairs (i, i + lag) with both lengths known, the share whose lengths are equal."""
    both = known[:-lag] & known[lag:]
    m = int(both.sum())
    return float((lengths[:-lag] == lengths[lag:])[both].sum()) / m if m else 0.0


def chance_match(lengths: np.ndarray) -> float:
    counts = np.array(list(Counter(lengths.tolist()).values()), dtype=float)
    p = counts / counts.sum()
    return float((p * p).sum())


def detect_cycle(lengths: np.ndarray, known: np.ndarray) -> Cycle | None:
    """The period with which the known lengths repeat, or None when they show no cycle: the
    shortest lag whose match share passes the thresholds and is not beaten (beyond the tolerance)
    by its own multiples that fit the data."""
    n = len(lengths)
    max_lag = min(MAX_PERIOD, n // MIN_ROUNDS)
    if max_lag < 2 or known.sum() < 2 * MIN_ROUNDS:
        return None
    chance = chance_match(lengths[known])
    if chance >= 1.0:  # every prompt has one length: nothing to tell prompts apart by
        return None
    floor = max(MIN_SHARE, max(chance, match_share(lengths, known, 1)) + MIN_EXCESS * (1.0 - chance))
    for lag in range(2, max_lag + 1):
        share = match_share(lengths, known, lag)
        if share < floor:
            continue
        multiples = [match_share(lengths, known, k * lag) for k in (2, 3) if k * lag <= max_lag]
        if all(m <= share + PERIOD_TOLERANCE for m in multiples):
            return Cycle(lag, share, chance)
    return None


def slot_lengths(lengths: np.ndarray, known: np.ndarray, period: int) -> np.ndarray:
    """Each slot's prompt length: the most common known length at that slot (-1: none known)."""
    slot = np.arange(len(lengths)) % period
    out = np.full(period, -1, dtype=np.int64)
    for s in range(period):
        v = lengths[(slot == s) & known]
        if len(v):
            out[s] = Counter(v.tolist()).most_common(1)[0][0]
    return out


@dataclass(frozen=True)
class Assignment:
    prompt: np.ndarray  # prompt id per request: its slot, or period + k for the k-th unmatched request
    lengths: np.ndarray  # input lengths, unknown ones filled from their slot's prompt
    n_swapped: int
    n_unmatched: int
    n_imputed: int


def assign_prompts(lengths: np.ndarray, known: np.ndarray, period: int) -> Assignment:
    """Each request's prompt under a cycle of `period` (see the module docstring)."""
    n = len(lengths)
    canon = slot_lengths(lengths, known, period)
    slot = np.arange(n) % period
    prompt = slot.astype(np.int64).copy()
    filled = lengths.astype(np.int64).copy()
    unknown = ~known & (canon[slot] > 0)
    filled[unknown] = canon[slot[unknown]]
    swapped = unmatched = 0
    for i in np.flatnonzero(known & (lengths != canon[slot])):
        s = slot[i]
        hits = [(s + d) % period for d in NEIGHBOURS if canon[(s + d) % period] == lengths[i]]
        # two sends that swapped places: the neighbour at i +- 1 carries this slot's length
        pair = [t for t in hits if 0 <= i + (t - s) < n and (t - s) in (1, -1) and lengths[i + (t - s)] == canon[s]]
        if pair or hits:
            prompt[i] = (pair or hits)[0]
            swapped += 1
        else:
            prompt[i] = period + unmatched
            unmatched += 1
    # unknown lengths with no slot length either stay as given (the loader imputes them)
    return Assignment(prompt, filled, swapped, unmatched, int(unknown.sum()))


def prefix_groups(inputs: np.ndarray, prefix_len: int, groups: int) -> np.ndarray:
    """Which shared system prompt each request starts with: group i % groups for request i (so
    the first `groups` requests are each group's first), -1 for a prompt no longer than it."""
    g = np.arange(len(inputs), dtype=np.int64) % groups
    return np.where(inputs > prefix_len, g, -1)


def expected_cached_share(inputs: np.ndarray, sharing: Sharing, block: int) -> float:
    """Share of prompt tokens served from a cache that never evicts, by vLLM's rule (full blocks,
    the prompt's last token always computed): an upper bound on what the replay's cache serves."""
    seen_prompts: set[int] = set()
    seen_groups: set[int] = set()
    cached = 0
    for i in range(len(inputs)):
        n = int(inputs[i])
        limit = (n - 1) // block * block
        p, g = int(sharing.prompt[i]), int(sharing.group[i])
        if p in seen_prompts:
            cached += limit
        elif g >= 0 and g in seen_groups:
            cached += min(sharing.group_tokens[g] // block * block, limit)
        seen_prompts.add(p)
        if g >= 0:
            seen_groups.add(g)
    total = int(inputs.sum())
    return cached / total if total else 0.0


def cycle_sharing(assignment: Assignment, period: int, system_len: int, groups: int) -> Sharing:
    """Cycled prompts: prompt p of the list is in system-prompt group p % groups (unmatched
    requests keep their slot's group); a group shares its system prompt when it fills a block."""
    n = len(assignment.prompt)
    if system_len <= 0 or groups <= 0:
        return Sharing(assignment.prompt, np.full(n, -1, dtype=np.int64), ())
    slot = np.arange(n) % period
    home = np.where(assignment.prompt < period, assignment.prompt, slot)
    group = np.where(assignment.lengths > system_len, home % groups, -1).astype(np.int64)
    return Sharing(assignment.prompt, group, (int(system_len),) * groups)


def trace_sharing(sharing: Sharing, inputs: np.ndarray) -> tuple[Sharing, list[str]]:
    """The sharing a BLIS trace v2 can state, and its group names. A trace gives a request at most
    one prefix group, whose tokens BLIS draws at random once per group, so two groups never share
    a token: a request whose prompt was sent more than once is in group "p<prompt>" covering its
    whole prompt; any other request in a shared-prefix group g is in group "sp<g>"; the rest are
    in none. What this loses against `sharing`: prompts of one system-prompt group no longer share
    the system prompt with each other (it matters at a prompt's first send and after its own
    blocks were evicted)."""
    n = len(inputs)
    ids, counts = np.unique(sharing.prompt, return_counts=True)
    resent = set(ids[counts > 1].tolist())
    names: list[str] = []
    lengths: list[int] = []
    index: dict[str, int] = {}
    group = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        p, g = int(sharing.prompt[i]), int(sharing.group[i])
        if p in resent:
            name, length = f"p{p}", int(inputs[i])
        elif g >= 0 and sharing.group_tokens[g] > 0:
            name, length = f"sp{g}", int(sharing.group_tokens[g])
        else:
            continue
        k = index.setdefault(name, len(names))
        if k == len(names):
            names.append(name)
            lengths.append(length)
        group[i] = k
    return Sharing(np.arange(n, dtype=np.int64), group, tuple(lengths)), names
