"""What the cascade's promotions bought in a run (issue 25): for every promoted child, how its
screening loss compared with its cell's elite at the time, and whether its full fit beat that
elite's validation loss, entered the Pareto front or set a new best.

    python tools/promotion_outcomes.py ARCHIVE_DIR

Promotion compares a child's quick loss (a fit on the screening windows) with the elites'
screening loss (their fitted constants scored on the same windows, not fitted there); the second
table compares like with like, the child's quick loss with its cell elite's own quick loss.
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from stepml_evolve.archive.map_elites import AddStatus, Elites, cell_of
from stepml_evolve.archive.store import Archive
from stepml_evolve.evolve.search.settings import SearchConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("archive")
    args = ap.parse_args()
    archive = Archive.open(args.archive)
    try:
        programs = archive.programs(archive.run().id)
    finally:
        archive.close()
    outcomes: collections.Counter = collections.Counter()
    ratios = []
    promoted = [p for p in programs if p.operator != "seed" and p.stage == "full"]
    by_id = {p.id: p for p in programs}
    for p in promoted:
        now = Elites.of([q for q in programs if q.generation < p.generation])
        elite = now.grid.get(cell_of(p.complexity, p.n_components))
        kind = "opened a cell" if elite is None else "against an elite"
        outcomes[kind, "promoted"] += 1
        for what, yes in bought(p, now).items():
            outcomes[kind, what] += yes
        if elite is not None and elite.quick_loss and elite.screen_loss:
            parent = min((by_id[i].val_loss for i in p.parents if by_id[i].val_loss is not None), default=np.nan)
            ratios.append(
                (
                    p.quick_loss / elite.screen_loss,
                    p.quick_loss / elite.quick_loss,
                    p.val_loss / elite.val_loss,
                    parent / elite.val_loss,
                    p.screen_loss / elite.screen_loss,
                )
            )
    print(f"{len(promoted)} promoted children")
    for kind in ("against an elite", "opened a cell"):
        print(f"  {kind}: " + ", ".join(f"{what} {outcomes[kind, what]}" for what in ("promoted", *GAINS)))
    r = np.array(ratios).reshape(-1, 5)
    print(
        f"{len(r)} against an elite with a quick loss of its own: child quick / elite screening loss, median "
        f"{np.median(r[:, 0]):.2f}; child quick / elite quick, median {np.median(r[:, 1]):.2f}"
    )
    for lo, hi in ((0, 0.9), (0.9, 1.0), (1.0, 1.1), (1.1, np.inf)):
        m = (r[:, 1] >= lo) & (r[:, 1] < hi)
        if m.any():
            print(
                f"  child quick / elite quick in [{lo}, {hi}): {m.sum()} promoted, {int((r[m, 2] < 1).sum())} beat "
                f"the elite, median validation loss {np.median(r[m, 2]):.2f}x the elite's"
            )

    print("rank correlation with the child's validation loss over its elite's:")
    for i, what in (
        (1, "child quick / elite quick (what screening knows, like with like)"),
        (0, "child quick / elite screening loss (what promotion compares)"),
        (3, "best parent's validation loss / elite's (known before screening)"),
        (4, "child's screening loss at its full-fit constants / elite's (known after the full fit)"),
    ):
        print(f"  {_rank_correlation(r[:, i], r[:, 2]):+.2f}  {what}")
    _first_and_second(programs)


def _first_and_second(programs: list) -> None:
    """In the generations that promoted two children: what the first in promotion order (children
    improving on an elite before children opening a cell, then by quick loss over the reference
    they beat) bought against the second; what a limit of one promotion a generation would keep."""
    by_generation = collections.defaultdict(list)
    for p in programs:
        if p.operator != "seed" and p.stage == "full":
            by_generation[p.generation].append(p)
    by_place: collections.Counter = collections.Counter()
    pairs = 0
    for g, promoted in by_generation.items():
        if len(promoted) != 2:
            continue
        pairs += 1
        now = Elites.of([q for q in programs if q.generation < g])
        ranked = []
        for p in promoted:
            status, rank = now.status(p.complexity, p.n_components, p.quick_loss, SearchConfig.promote_margin)
            ranked.append(((status is not AddStatus.IMPROVES, rank), p))
        ranked.sort(key=lambda t: t[0])
        for place, (_, p) in zip(("first", "second"), ranked):
            for what, yes in bought(p, now).items():
                by_place[place, what] += yes
    print(f"{pairs} generations promoted two children; what each bought, by promotion order:")
    for place in ("first", "second"):
        print(f"  {place}: " + ", ".join(f"{what} {by_place[place, what]}" for what in GAINS))


GAINS = ("beat the elite", "entered the front", "new best")


def bought(p, now: Elites) -> dict[str, bool]:
    """What promoted child `p`'s full fit bought against the archive before it (`now`): it beat its
    cell's elite (or opened the cell), entered the front (beat every simpler member), set a new best
    (by validation loss)."""
    elite = now.grid.get(cell_of(p.complexity, p.n_components))
    front = [q.val_loss for q in now.front if q.complexity <= p.complexity]
    best = min(q.val_loss for q in now.grid.values())
    return dict(
        zip(
            GAINS,
            (elite is None or p.val_loss < elite.val_loss, not front or p.val_loss < min(front), p.val_loss < best),
        )
    )


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (no ties among these losses)."""
    return float(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1])


if __name__ == "__main__":
    main()
