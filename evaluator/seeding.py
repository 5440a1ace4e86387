"""Seeds derived from a seed and the place a random stream is used at, so that every stream is its
own: none is shared, and none depends on the order in which streams are drawn or fits finish.

Two mixes, each kept exactly as first written (an archive depends on every number they give):
  `mix(*parts)`            64 bits of the sha256 of the parts: the search's streams (a child's
                           proposal, its screening and full fits, a seed program's fit);
  `cma_seed(seed, *parts)` one CMA-ES run inside a fit: the fit's seed and up to three integers
                           (group, restart, iteration), prime-weighted, in pycma's range 1 .. 2**31 - 2.
"""

from __future__ import annotations

import hashlib
import json

CMA_SEED_WEIGHT = 7919
CMA_PART_WEIGHTS = (1, 104729, 1299709)  # of cma_seed's parts, in order


def mix(*parts: int) -> int:
    """A 64-bit seed from integers of any size."""
    h = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(h[:8], "little")


def cma_seed(seed: int, *parts: int) -> int:
    """The seed of one CMA-ES run of a fit seeded `seed`: 1 .. 2**31 - 2."""
    weighted = sum(p * w for p, w in zip(parts, CMA_PART_WEIGHTS[: len(parts)], strict=True))
    return (seed * CMA_SEED_WEIGHT + weighted) % (2**31 - 2) + 1
