"""Parent selection: elites by tournament, Pareto-front members, and uniformly random cells."""

from __future__ import annotations

import random

from stepml_evolve.archive.map_elites import Cell
from stepml_evolve.archive.records import ProgramRecord

TOURNAMENT = 3
P_ELITE, P_FRONT = 0.4, 0.3  # the rest: a random occupied cell


def select_parent(
    rng: random.Random, grid: dict[Cell, ProgramRecord], front: list[ProgramRecord], exclude: int | None = None
) -> tuple[ProgramRecord, str]:
    """A parent and how it was chosen ("elite", "front" or "cell")."""
    cells = sorted(grid)
    elites = [grid[c] for c in cells if grid[c].id != exclude] or [grid[c] for c in cells]
    r = rng.random()
    if r < P_ELITE:
        picks = [elites[rng.randrange(len(elites))] for _ in range(TOURNAMENT)]
        return min(picks, key=lambda p: (p.val_loss, p.id)), "elite"
    pool = [p for p in front if p.id != exclude] or front
    if r < P_ELITE + P_FRONT and pool:
        return pool[rng.randrange(len(pool))], "front"
    return elites[rng.randrange(len(elites))], "cell"


def examples_for(
    parent: ProgramRecord, grid: dict[Cell, ProgramRecord], rng: random.Random, n: int = 3
) -> list[ProgramRecord]:
    """The best programs plus one from another cell, excluding the parent (for LLM prompts)."""
    others = sorted((p for p in grid.values() if p.id != parent.id), key=lambda p: (p.val_loss, p.id))
    picked = others[: max(0, n - 1)]
    rest = [p for p in others if p not in picked]
    if rest:
        picked.append(rest[rng.randrange(len(rest))])
    return picked
