"""MAP-Elites grid and Pareto front over archived programs (queries only; nothing is stored).

Cells: (complexity bin, number of distinct components used). The elite of a cell is its
fully evaluated program with the lowest validation loss (ties: the older program). The
front holds programs not dominated in (validation loss, complexity), both minimized.
"""
from __future__ import annotations

import math

from .store import ProgramRecord

COMPLEXITY_BIN = 8  # AST nodes per bin
MAX_COMPLEXITY_BIN = 24  # complexity >= 192 shares the last bin

Cell = tuple[int, int]


def cell_of(complexity: int, n_components: int) -> Cell:
    return (min(complexity // COMPLEXITY_BIN, MAX_COMPLEXITY_BIN), n_components)


def cell_label(cell: Cell) -> str:
    lo = cell[0] * COMPLEXITY_BIN
    hi = "+" if cell[0] == MAX_COMPLEXITY_BIN else f"-{lo + COMPLEXITY_BIN - 1}"
    return f"complexity {lo}{hi}, {cell[1]} components"


def _key(p: ProgramRecord) -> tuple[float, int]:
    v = p.val_loss if p.val_loss is not None and math.isfinite(p.val_loss) else math.inf
    return (v, p.id)


def scored(programs: list[ProgramRecord]) -> list[ProgramRecord]:
    return [p for p in programs if p.full and p.val_loss is not None and math.isfinite(p.val_loss)]


def elites(programs: list[ProgramRecord]) -> dict[Cell, ProgramRecord]:
    grid: dict[Cell, ProgramRecord] = {}
    for p in scored(programs):
        c = cell_of(p.complexity, p.n_components)
        if c not in grid or _key(p) < _key(grid[c]):
            grid[c] = p
    return grid


def pareto_front(programs: list[ProgramRecord]) -> list[ProgramRecord]:
    """Non-dominated programs in (validation loss, complexity), by increasing complexity."""
    front: list[ProgramRecord] = []
    best = math.inf
    for p in sorted(scored(programs), key=lambda p: (p.complexity, p.val_loss, p.id)):
        if p.val_loss < best:
            front.append(p)
            best = p.val_loss
    return front


def best(programs: list[ProgramRecord]) -> ProgramRecord | None:
    s = scored(programs)
    return min(s, key=_key) if s else None
