"""MAP-Elites grid and Pareto front over archived programs (queries only; nothing is stored).

Cells: (complexity bin, number of distinct components used). The elite of a cell is its
fully evaluated program with the lowest validation loss (ties: the older program). The
front holds programs not dominated in (validation loss, complexity), both minimized.
`Elites.status` answers, as pyribs' archives do on `add`, whether a candidate would open a
new cell, improve on a cell's elite or the front, or neither.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from .records import ProgramRecord

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


class AddStatus(enum.Enum):
    NEW_CELL = "new_cell"  # its cell is empty
    IMPROVES = "improves"  # beats its cell's elite or every simpler front member (within the margin)
    NOT_ADDED = "not_added"


@dataclass
class Elites:
    """The grid and the front of a set of programs (e.g. one island), and the add-status query."""

    grid: dict[Cell, ProgramRecord]
    front: list[ProgramRecord]

    @classmethod
    def of(cls, programs: list[ProgramRecord]) -> Elites:
        return cls(elites(programs), pareto_front(programs))

    def best_screen_loss(self) -> float:
        screens = [p.screen_loss for p in self.grid.values() if p.screen_loss is not None]
        return min(screens) if screens else math.inf

    def status(self, complexity: int, n_components: int, screen_loss: float, margin: float) -> tuple[AddStatus, float]:
        """Where a candidate with this screening loss would stand, compared like with like with the
        screening losses of the archived programs: (status, its loss over the reference it beats;
        for a new cell its own loss)."""
        if cell_of(complexity, n_components) not in self.grid:
            return AddStatus.NEW_CELL, screen_loss
        ref = self.reference(complexity, n_components)
        if ref is not None and screen_loss < ref.screen_loss * (1 + margin):
            return AddStatus.IMPROVES, screen_loss / ref.screen_loss
        return AddStatus.NOT_ADDED, math.nan

    def promotion_key(
        self, complexity: int, n_components: int, screen_loss: float, margin: float
    ) -> tuple[int, float] | None:
        """A candidate's place in the queue for a full fit: (0, its loss over the reference it beats)
        for one that would improve its cell's elite or enter the front (an empty cell's candidate
        that beats every simpler program of the front too: opening a cell does not make it less of
        an improvement), then (1, its own loss) for one that only opens a cell; None: neither."""
        status, rank = self.status(complexity, n_components, screen_loss, margin)
        if status is AddStatus.IMPROVES:
            return 0, rank
        if status is AddStatus.NEW_CELL:
            best = self._best_simpler(complexity)
            if best is not None and screen_loss < best.screen_loss * (1 + margin):
                return 0, screen_loss / best.screen_loss
            return 1, rank
        return None

    def _best_simpler(self, complexity: int) -> ProgramRecord | None:
        """The front's program no more complex than `complexity` with the lowest screening loss."""
        simpler = [p for p in self.front if p.complexity <= complexity and p.screen_loss is not None]
        return min(simpler, key=lambda p: p.screen_loss) if simpler else None

    def reference(self, complexity: int, n_components: int) -> ProgramRecord | None:
        """The program `status` compares a candidate of this cell with: to enter the grid it must
        beat its cell's elite, to enter the front every simpler program, so the easier of the two
        (the higher screening loss). None: an empty cell, or no screening loss to compare with."""
        elite = self.grid.get(cell_of(complexity, n_components))
        if elite is None:
            return None
        best = self._best_simpler(complexity)
        refs = [best] if best is not None else []
        if elite.screen_loss is not None:
            refs.append(elite)
        return max(refs, key=lambda p: p.screen_loss) if refs else None
