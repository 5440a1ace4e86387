"""What other screening settings would have done at points of a finished run (issue 25): for each
generation G given, a copy of the run's archive cut back to G, one generation run from it with
each variant's flags, and its promoted children compared with the ones the run itself promoted
in generation G + 1. The children proposed are the same (a generation's proposals depend on the
archive and the seed, not on screening), so what differs is the screening's verdict and the full
fits that start from its constants.

    python tools/screening_variants.py ARCHIVE --data ../shared/data/replay --at 120,125,130 \
        --variant "default=--quick-surrogate 0" --variant "qs80=--quick-surrogate 80" > out.txt

A variant's flags are written into the copy's stored settings too (so --resume accepts them).
Each generation runs under tools/generation_cpu.py, whose process CPU is the figure to compare
(wall seconds depend on what else the machine runs). Copies go to --work (default: a temporary
directory); a generation already run there is not run again.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from stepml_evolve.archive.store import Archive
from stepml_evolve.evolve.search.settings import NONE_AS

TOOLS = Path(__file__).resolve().parent
CUT = ("programs", "rejections", "llm_calls", "generations")  # rows with a generation column
BY_PROGRAM = ("evaluations", "cv_scores", "cv_evaluations")


def cut_back(src: Path, dst: Path, generation: int, settings: dict) -> None:
    """Copy the archive in src to dst without anything after `generation`, with `settings` in
    its stored search settings."""
    dst.mkdir(parents=True, exist_ok=True)
    source, copy = sqlite3.connect(src / Archive.FILE), sqlite3.connect(dst / Archive.FILE)
    source.backup(copy)
    source.close()
    later = "SELECT id FROM programs WHERE generation > ?"
    for table in BY_PROGRAM:
        copy.execute(f"DELETE FROM {table} WHERE program_id IN ({later})", (generation,))
    for table in CUT:
        copy.execute(f"DELETE FROM {table} WHERE generation > ?", (generation,))
    run_id, config = copy.execute("SELECT id, config FROM runs").fetchone()
    config = json.loads(config)
    config["search"].update(settings)
    copy.execute("UPDATE runs SET config=? WHERE id=?", (json.dumps(config), run_id))
    copy.commit()
    copy.close()


def settings_of(flags: list[str]) -> dict:
    """The stored search settings a variant's flags give (as `evolve run` stores them: the
    value NONE_AS names for a setting is None)."""
    out: dict = {}
    for flag, value in zip(flags[::2], flags[1::2]):
        key = flag.removeprefix("--").replace("-", "_")
        out[key] = None if NONE_AS.get(key) == value else _number(value)
    return out


def _number(value: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value  # a mode, e.g. --cv lomo


def promoted(db: Path, generation: int) -> dict[str, tuple[float, float, float]]:
    """structure hash -> (train, validation, quick loss) of the children promoted in `generation`."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT source_hash, train_loss, val_loss, quick_loss FROM programs WHERE generation=? AND stage='full'",
            (generation,),
        ).fetchall()
    finally:
        con.close()
    return {h: (t, v, q) for h, t, v, q in rows}


def validation_apes(db: Path, generation: int, structure: str) -> dict[str, float]:
    """experiment -> E2E + TTFT APE on the validation split of the child promoted in
    `generation` with this structure hash."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT e.experiment, coalesce(e.ape_e2e, 0) + coalesce(e.ape_ttft, 0) FROM evaluations e "
            "JOIN programs p ON p.id = e.program_id "
            "WHERE p.generation=? AND p.stage='full' AND p.source_hash=? AND e.split='validate'",
            (generation, structure),
        ).fetchall()
    finally:
        con.close()
    return dict(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("archive", type=Path)
    ap.add_argument("--data", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--at", required=True, help="generations to cut back to, comma-separated")
    ap.add_argument("--variant", action="append", required=True, help='NAME="--flag value ..." (flags of evolve run)')
    ap.add_argument(
        "--reference",
        help="compare with this variant's generation (default: with the run's own; a run's early "
        "generations may have been made by older code, whose full fits end elsewhere)",
    )
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="screening-variants-"))
    variants = [(v.split("=", 1)[0], shlex.split(v.split("=", 1)[1])) for v in args.variant]
    live = args.archive / Archive.FILE
    totals: dict[str, dict[str, list[float]]] = {
        name: {"cpu": [], "same": [], "train": [], "val": []} for name, _ in variants
    }
    swings: collections.Counter = collections.Counter()
    order = sorted(variants, key=lambda v: v[0] != args.reference)  # the reference first
    for g in (int(x) for x in args.at.split(",")):
        run_own = reference = promoted(live, g + 1)
        reference_db = live
        for name, flags in order:
            copy = work / f"g{g}-{name}"
            if not (copy / "done").exists():
                cut_back(args.archive, copy, g, settings_of(flags))
                cmd = [sys.executable, str(TOOLS / "generation_cpu.py"), "run", "--generations", str(g + 1)]
                cmd += ["--seed", str(args.seed), "--data", args.data, "--archive", str(copy), "--resume"]
                cmd += ["--front-cv", "none", *flags]
                res = subprocess.run(cmd, capture_output=True, text=True)
                (copy / "stderr.txt").write_text(res.stderr)
                if res.returncode != 0:
                    sys.exit(f"{copy}: evolve run failed: {res.stderr.strip().splitlines()[-1]}")
                (copy / "done").touch()
            cpu = float(re.search(r"process CPU ([\d.]+)", (copy / "stderr.txt").read_text())[1])
            mine = promoted(copy / Archive.FILE, g + 1)
            if name == args.reference:
                reference, reference_db = mine, copy / Archive.FILE
                print(f"generation {g + 1} {name}: the run's own generation reproduced: {mine == run_own}")
            common = sorted(set(mine) & set(reference))
            t = totals[name]
            t["cpu"].append(cpu)
            t["same"].append(set(mine) == set(reference))
            t["train"] += [math.log(mine[h][0] / reference[h][0]) for h in common]
            t["val"] += [math.log(mine[h][1] / reference[h][1]) for h in common]
            for h in common if name != args.reference else ():  # which experiment's validation moved most
                a, b = validation_apes(copy / Archive.FILE, g + 1, h), validation_apes(reference_db, g + 1, h)
                moved = {e: abs(a[e] - b.get(e, 0.0)) for e in a}
                if moved and max(moved.values()) > 0:
                    swings[max(moved, key=moved.get)] += 1
            pairs = ", ".join(
                f"{mine[h][0]:.2f}/{mine[h][1]:.2f} vs {reference[h][0]:.2f}/{reference[h][1]:.2f}" for h in common
            )
            print(
                f"generation {g + 1} {name}: process CPU {cpu:.1f} s, promoted {len(mine)}, "
                f"same children as the reference: {set(mine) == set(reference)}; "
                f"train/val of the same children (vs the reference's): {pairs}",
                flush=True,
            )
    print(
        "\nvariant | generations | mean process CPU s | same promotions | "
        "same children's train, val (geometric mean ratio to the reference's)"
    )
    for name, t in totals.items():
        ratio = {k: math.exp(statistics.fmean(t[k])) if t[k] else math.nan for k in ("train", "val")}
        spread = {k: statistics.pstdev(t[k]) if t[k] else math.nan for k in ("train", "val")}
        print(
            f"{name} | {len(t['cpu'])} | {statistics.fmean(t['cpu']):.1f} | {sum(t['same'])} of {len(t['same'])} | "
            f"{ratio['train']:.3f}, {ratio['val']:.3f} (n {len(t['train'])}; "
            f"sd of the log ratios {spread['train']:.3f}, {spread['val']:.3f})"
        )
    print("\nthe experiment whose validation APEs moved most between the same child's two fits:")
    for experiment, n in swings.most_common(5):
        print(f"  {experiment}: {n} of {sum(swings.values())}")


if __name__ == "__main__":
    main()
