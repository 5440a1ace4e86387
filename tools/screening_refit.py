"""What the screening names on a finished worlds benchmark's fitted seeds, at the seeds' constants and
with their constants refitted beside each term (issue 64: a term judged by its best fit).

For every world of `evolve bench --worlds --out DIR` that holds SPLIT's archive and train data,
each generation-0 program (the seeds' fits) is screened on its train residuals twice, tethered to
itself as a seed's screening is (`screen_program`): at the seed's own constants, and with its
constants refitted beside each term (`refit=True`, discovery/refit.py). Prints, per seed, how
many terms pass each way and the best ones (gain and chance, % of the residual); --json writes
them all.

    python tools/screening_refit.py DIR [--split by-gpu] [--top 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.discovery.residuals import residuals_of
from stepml_evolve.evaluator.discovery.screening import screen_program, tethered_to
from stepml_evolve.evaluator.dsl import parse_program
from stepml_evolve.evaluator.scoring.pool import ReplayPool


def seeds_of(archive: Path) -> list[tuple[int, str]]:
    """(id, source) of the archive's generation-0 programs."""
    with sqlite3.connect(f"file:{archive / 'archive.sqlite'}?mode=ro", uri=True) as db:
        return db.execute("SELECT id, source FROM programs WHERE generation = 0 ORDER BY id").fetchall()


def screened(pool: ReplayPool, source: str, top: int) -> dict:
    program = parse_program(source)
    constants = dict(program.constants)
    residuals = residuals_of(program, constants, pool)
    tether = tethered_to(program, constants)
    out = {"doc": (program.doc or "").split(":")[0]}
    for name, refit in (("plain", False), ("refit", True)):
        s = screen_program(program, constants, residuals, tether, refit)
        best = [(p.term.shown(), round(100 * p.gain, 1), round(100 * p.chance, 1)) for p in s.passed[:top]]
        out[name] = {"passed": len(s.passed), "false_passes": s.false_passes, "best": best}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="screening_refit.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the benchmark's --out directory")
    parser.add_argument("--split", default="by-gpu")
    parser.add_argument("--top", type=int, default=2, help="best passing terms shown per seed and way")
    parser.add_argument("--json", type=Path, help="write every seed's result here")
    args = parser.parse_args()
    results = {}
    for world in sorted(p for p in args.out.iterdir() if (p / f"{args.split}-archive").is_dir()):
        loaded = load_data(world / f"{args.split}-train")
        with ReplayPool(loaded.experiments, workers=1) as pool:
            for pid, source in seeds_of(world / f"{args.split}-archive"):
                r = results[f"{world.name} #{pid}"] = screened(pool, source, args.top)
                print(
                    f"{world.name} #{pid} ({r['doc']}) | at its constants: {r['plain']['passed']} pass "
                    f"{r['plain']['best']} | refitted beside: {r['refit']['passed']} pass {r['refit']['best']}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
