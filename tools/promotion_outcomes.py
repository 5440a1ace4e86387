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

from stepml_evolve.archive.grid import cell_of, elites, pareto_front
from stepml_evolve.archive.store import Archive


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
    for p in promoted:
        before = [q for q in programs if q.generation < p.generation]
        elite = elites(before).get(cell_of(p.complexity, p.n_components))
        front = [q.val_loss for q in pareto_front(before) if q.complexity <= p.complexity]
        best = min(q.val_loss for q in before if q.full)
        kind = "opened a cell" if elite is None else "against an elite"
        outcomes[kind, "promoted"] += 1
        outcomes[kind, "beat the elite"] += elite is None or p.val_loss < elite.val_loss
        outcomes[kind, "entered the front"] += not front or p.val_loss < min(front)
        outcomes[kind, "new best"] += p.val_loss < best
        if elite is not None and elite.quick_loss and elite.screen_loss:
            ratios.append(
                (p.quick_loss / elite.screen_loss, p.quick_loss / elite.quick_loss, p.val_loss / elite.val_loss)
            )
    print(f"{len(promoted)} promoted children")
    for kind in ("against an elite", "opened a cell"):
        print(
            f"  {kind}: "
            + ", ".join(
                f"{what} {outcomes[kind, what]}"
                for what in ("promoted", "beat the elite", "entered the front", "new best")
            )
        )
    r = np.array(ratios).reshape(-1, 3)
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


if __name__ == "__main__":
    main()
