"""Held-out configuration groups: each split holds out what lies outside the rest, so a law fitted
on the others must extrapolate (a GPU it never saw, larger models, server knobs beyond the
trained range). Written as `evolve cv --protocol groups:FILE` files, one fold per split."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .grid import TRAINED_SEQS, TRAINED_TOKENS, Configuration
from .laws import WorldError

LARGE_MODEL_PARAMETERS = 20e9


@dataclass(frozen=True)
class Split:
    name: str
    fold: str  # the held-out fold's name
    held_out: Callable[[Configuration], bool]
    description: str


SPLITS = (
    Split("by-gpu", "L40S", lambda c: c.hardware == "L40S", "train on H100 and A100, predict L40S (PCIe, GDDR6)"),
    Split(
        "by-size",
        "over-20b",
        lambda c: c.parameters > LARGE_MODEL_PARAMETERS,
        "train on models up to 20B parameters, predict the larger ones",
    ),
    Split(
        "by-knobs",
        "outside-knobs",
        lambda c: not c.trained_knobs,
        f"train on max_num_batched_tokens {TRAINED_TOKENS[0]}-{TRAINED_TOKENS[1]} and max_num_seqs "
        f"{TRAINED_SEQS[0]}-{TRAINED_SEQS[1]}, predict settings outside both",
    ),
)


def make_splits(configs: list[Configuration]) -> dict[str, dict[str, list[str]]]:
    """split name -> {fold: held-out experiment names}; WorldError when a split would hold out
    nothing or everything (a grid too small to test it)."""
    out = {}
    for s in SPLITS:
        held = [c.name for c in configs if s.held_out(c)]
        if not held or len(held) == len(configs):
            what = "no configuration" if not held else "every configuration"
            raise WorldError(f"split {s.name}: the grid holds out {what} ({s.description}); use a larger grid")
        out[s.name] = {s.fold: held}
    return out
