"""What a promoted child's first full evaluation says about its full fit (issue 54): from points
of a finished run, a few generations re-run while every full fit's history is recorded (the loss
at its start, the screening constants on every experiment's training window, then after each
closed-loop evaluation); then, for each promoted child, its start loss over the reference its
promotion had to beat (the train loss of the program promotion compared its quick loss with,
`Elites.reference`) and what the full fit bought (promotion_outcomes.bought):
beat the elite, entered the front, a new best. The table says which stopping factors would have
ended hopeless fits after one evaluation and which of them would have cost a gain. With
--surrogate N,..., each promoted child's full fit is also run with N surrogate evaluations per
trust-region iteration (for comparison only; the run keeps its own), and its final train loss
and the fitting thread's CPU (the surrogate steps and the driver; the replays run on the pool's
threads) are compared with the run's fit.

    python tools/full_fit_starts.py ARCHIVE --data ../shared/data/replay --at 100,250,400 \
        --generations 8 --work DIR [--own-start] [--surrogate 100,60]

Copies cut back to each generation go to --work (default: a temporary directory); a copy
already run there is not run again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from stepml_evolve.archive.map_elites import Elites, cell_of
from stepml_evolve.archive.store import Archive

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
from promotion_outcomes import bought  # noqa: E402
from screening_variants import cut_back  # noqa: E402

TRACES = "full_fit_traces.jsonl"


def record(out: Path, evolve_args: list[str], own_start: bool = False, surrogates: tuple[int, ...] = ()) -> None:
    """Run `evolve` with every promoted child's full-fit history appended to `out` (own_start: and
    the history of the same fit started from the child's own constants instead of its screening
    fit's, which the run does not use; surrogates: and the final loss and fitting-thread CPU of
    the same fit with each number of surrogate evaluations per iteration)."""
    from stepml_evolve.evolve.cli import main
    from stepml_evolve.evolve.search import cascade

    inside = threading.local()
    lock = threading.Lock()
    fit, full_fit = cascade.fit_constants, cascade.Cascade._full_fit

    def traced_fit(program, *args, **kwargs):
        cpu = time.thread_time()
        res = fit(program, *args, **kwargs)
        cpu = time.thread_time() - cpu
        if getattr(inside, "full", False):
            line = {"hash": cascade.structure_hash(program), "history": res.history, "loss": res.loss, "cpu": cpu}
            exps, pool, config = args[:3]
            for n in surrogates:  # the same fit with another surrogate budget, for comparison only
                cpu = time.thread_time()
                other = fit(program, exps, pool, dataclasses.replace(config, surrogate_evals=n), **kwargs)
                line[f"surrogate_{n}"] = {"loss": other.loss, "cpu": time.thread_time() - cpu}
            if own_start:  # the same fit from the child's own constants, for comparison only
                other = fit(program, *args, **{**kwargs, "start": program.constants})
                line["own_history"], line["own_loss"] = other.history, other.loss
            with lock, out.open("a") as f:
                f.write(json.dumps(line) + "\n")
        return res

    def traced_full_fit(self, *args, promoted=True, **kwargs):
        inside.full = promoted
        try:
            return full_fit(self, *args, promoted=promoted, **kwargs)
        finally:
            inside.full = False

    cascade.fit_constants, cascade.Cascade._full_fit = traced_fit, traced_full_fit
    sys.argv = ["evolve", *evolve_args]
    main()


def outcomes(copy: Path, cut: int) -> list[dict]:
    """Each child promoted after generation `cut` in the copy, with its start loss over the
    reference and what its full fit bought."""
    traces = {}
    for line in (copy / TRACES).read_text().splitlines():
        t = json.loads(line)
        traces[t["hash"]] = t
    archive = Archive.open(copy)
    try:
        programs = archive.programs(archive.run().id)
    finally:
        archive.close()
    rows = []
    for p in programs:
        if p.generation <= cut or p.stage != "full" or p.source_hash not in traces:
            continue
        now = Elites.of([q for q in programs if q.generation < p.generation])
        ref = now.reference(p.complexity, p.n_components)
        history = traces[p.source_hash]["history"]
        start = history[0][1] if history else math.nan
        gains = bought(p, now)
        rows.append(
            {
                "generation": p.generation,
                # a child opening a cell had no reference to beat
                "start_over_reference": start / ref.train_loss if ref is not None else math.nan,
                "final_over_start": p.train_loss / start,
                "new_cell": now.grid.get(cell_of(p.complexity, p.n_components)) is None,
                "gain": any(gains.values()),
                **{what.replace(" ", "_"): yes for what, yes in gains.items()},
            }
        )
        for key, alt in traces[p.source_hash].items():
            if key.startswith("surrogate_"):
                rows[-1][f"{key}_final_over_final"] = alt["loss"] / traces[p.source_hash]["loss"]
                rows[-1][f"{key}_cpu_over_cpu"] = alt["cpu"] / traces[p.source_hash]["cpu"]
        own = traces[p.source_hash].get("own_history")
        if own:
            final = history[-1][1]
            rows[-1]["own_start_over_start"] = own[0][1] / start
            rows[-1]["own_final_over_final"] = own[-1][1] / final
            rows[-1]["own_evals_to_final"] = next((n for n, v in own if v <= final * 1.001), None)
            rows[-1]["evals"] = history[-1][0]
    return rows


def main() -> None:
    if sys.argv[1:2] in (["--record"], ["--record-both"]):
        surrogates = tuple(int(n) for n in sys.argv[3].split(",") if n)
        record(Path(sys.argv[2]), sys.argv[4:], own_start=sys.argv[1] == "--record-both", surrogates=surrogates)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("archive", type=Path)
    ap.add_argument("--data", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--at", required=True, help="generations to cut back to, comma-separated")
    ap.add_argument("--generations", type=int, default=8, help="generations to run from each cut")
    ap.add_argument("--factors", default="1.25,1.5,2,3", help="stopping factors to tabulate")
    ap.add_argument(
        "--own-start",
        action="store_true",
        help="also fit each promoted child from its own constants (not the run's fit) and compare",
    )
    ap.add_argument(
        "--surrogate",
        default="",
        help="also fit each promoted child with these surrogate evaluations per iteration (comma-separated) and compare",
    )
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="full-fit-starts-"))
    rows = []
    for g in (int(x) for x in args.at.split(",")):
        copy = work / f"g{g}"
        if not (copy / "done").exists():
            cut_back(args.archive, copy, g, {})
            (copy / TRACES).unlink(missing_ok=True)
            cmd = [
                sys.executable,
                __file__,
                "--record-both" if args.own_start else "--record",
                str(copy / TRACES),
                args.surrogate,
                "run",
            ]
            cmd += ["--generations", str(g + args.generations), "--seed", str(args.seed), "--data", args.data]
            cmd += ["--archive", str(copy), "--resume", "--front-cv", "none"]
            subprocess.run(cmd, check=True, capture_output=True)
            (copy / "done").touch()
        rows += outcomes(copy, g)
    ratio = np.array([r["start_over_reference"] for r in rows])
    gains = np.array([r["gain"] for r in rows])
    print(f"{len(rows)} promoted children, {int(gains.sum())} beat their elite, entered the front or set a new best")
    print(
        f"start loss / reference: median {np.nanmedian(ratio):.2f} (children opening a cell have none and are never stopped); final train / start: median "
        f"{np.median([r['final_over_start'] for r in rows]):.2f}, lowest {min(r['final_over_start'] for r in rows):.2f}"
    )
    print("factor | fits stopped after one evaluation | of them a gain (elite, front, best)")
    for k in (float(x) for x in args.factors.split(",")):
        stop = ratio > k
        lost = [r for r, s in zip(rows, stop) if s and r["gain"]]
        print(
            f"{k:g} | {int(stop.sum())} of {len(rows)} | {len(lost)}"
            + (
                f" (front {sum(r['entered_the_front'] for r in lost)}, best {sum(r['new_best'] for r in lost)})"
                if lost
                else ""
            )
        )
    for n in (x for x in args.surrogate.split(",") if x):
        paired = [r for r in rows if f"surrogate_{n}_final_over_final" in r]
        if paired:
            finals = np.array([r[f"surrogate_{n}_final_over_final"] for r in paired])
            cpus = np.array([r[f"surrogate_{n}_cpu_over_cpu"] for r in paired])
            print(
                f"{n} surrogate evaluations an iteration ({len(paired)} fits): final train loss over the run's "
                f"geometric mean {np.exp(np.log(finals).mean()):.3f} (lower in {int((finals < 1).sum())}, worse by "
                f"> 5 % in {int((finals > 1.05).sum())}); fitting-thread CPU over the run's geometric mean "
                f"{np.exp(np.log(cpus).mean()):.2f}"
            )
    both = [r for r in rows if "own_start_over_start" in r]
    if both:
        starts = np.array([r["own_start_over_start"] for r in both])
        finals = np.array([r["own_final_over_final"] for r in both])
        reached = [r["own_evals_to_final"] for r in both if r["own_evals_to_final"] is not None]
        print(
            f"from the child's own constants ({len(both)} fits): start loss over the screening constants' "
            f"geometric mean {np.exp(np.log(starts).mean()):.2f} (lower in {int((starts < 1).sum())}), final "
            f"train loss over theirs {np.exp(np.log(finals).mean()):.3f} (lower in {int((finals < 1).sum())}, "
            f"worse by > 5 % in {int((finals > 1.05).sum())}); reached their final loss in {len(reached)}, after "
            f"{np.median(reached) if reached else float('nan'):.0f} evaluations (median; theirs "
            f"{np.median([r['evals'] for r in both]):.0f})"
        )
    for r in sorted(rows, key=lambda r: -r["start_over_reference"])[:10]:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
