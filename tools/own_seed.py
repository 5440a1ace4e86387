"""Each deployment rule's pick against the seed it descends from, held out, on a finished worlds
benchmark (`evolve bench --worlds --out DIR`).

A winner worse than its own seed outside the training data is a defect: for every result of the
benchmark (a world, a split, a search seed) and every deployment rule the benchmark scored
(`rules` of each result), this follows the pick's lineage back to its seed in the search's archive
and compares the pick's held-out loss with that seed's (both as the benchmark scored them), then
prints per rule how often the pick is worse, the geometric mean of the ratio and the worst.

    python tools/own_seed.py --out bench-worlds [--json]

docs/results/physics.md ("Which program a search should deploy") cites it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from stepml_evolve.archive.browse import lineage, opened, resolve
from stepml_evolve.evolve.commands.bench_worlds_results import archive_of, stored_results


def against_own_seed(out: Path) -> dict[str, list[dict]]:
    """Per rule: one row per result, the pick, its seed, and their held-out losses."""
    rows: dict[str, list[dict]] = {}
    for path, result in stored_results(out):
        seeds = {s.program: s.loss for s in result.seeds}
        with opened(archive_of(path)) as archive:
            for rule, scored in result.rules:
                chain = lineage(archive, resolve(archive, scored.program.lstrip("#")))
                seed = chain[-1]["operator_detail"] if chain else None
                rows.setdefault(rule, []).append(
                    {
                        "world": result.world,
                        "split": result.split,
                        "search_seed": result.search_seed or 0,
                        "program": scored.program,
                        "seed": seed,
                        "loss": scored.loss,
                        "seed_loss": seeds.get(seed),
                    }
                )
    return rows


def summary(rows: list[dict]) -> dict:
    ratios = [r["loss"] / r["seed_loss"] for r in rows if r["seed_loss"]]
    return {
        "results": len(rows),
        "worse": sum(x > 1.0001 for x in ratios),
        "geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else math.nan,
        "worst": max(ratios, default=math.nan),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="the benchmark's directory (evolve bench --worlds --out)"
    )
    parser.add_argument("--json", action="store_true", help="print every row as JSON")
    args = parser.parse_args()
    rows = against_own_seed(args.out)
    if args.json:
        print(json.dumps({rule: {"summary": summary(r), "rows": r} for rule, r in rows.items()}, indent=1))
        return
    print(f"{'rule':12s} {'worse than its own seed':>24s} {'geometric mean':>15s} {'worst':>7s}")
    for rule, r in rows.items():
        s = summary(r)
        print(f"{rule:12s} {s['worse']:>17d} / {s['results']:<4d} {s['geomean']:>15.3f} {s['worst']:>7.2f}")


if __name__ == "__main__":
    main()
