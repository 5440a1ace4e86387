"""TTFT measured in steps: per load stage of each experiment, the fastest, 5th-percentile and median
TTFT of the successful requests, the mean inter-token time, and the TTFT percentiles divided by it.
A cached prompt computes a few tokens, so its TTFT is the time to get through the engine's
pipeline: whether that is a constant or a number of steps decides how a program may express it
(docs/concepts/design-notes.md, "Where a cached prompt's TTFT goes").

    python tools/ttft_in_steps.py [DATA_DIR] [--warmup-s 60]

Overloaded experiments (more than 1 % failed requests, or a TTFT over 10 s) are left out: their
TTFT is queueing. Stages come from profile.json's load stages; the first --warmup-s seconds of
each stage are skipped (the engine settles after a rate change).
"""

from __future__ import annotations

import argparse

import numpy as np

from stepml_evolve.evaluator.data.experiment_reader import experiment_dirs, load_experiment
from stepml_evolve.evaluator.data.experiments import LoadOptions  # noqa: E402
from stepml_evolve.evaluator.readers import read_json  # noqa: E402


def stages(profile: dict) -> list[tuple[float, float, float]]:
    """(start s, end s, rate) of each load stage."""
    out, t0 = [], 0.0
    for st in (profile.get("load") or {}).get("stages") or []:
        out.append((t0, t0 + float(st["duration"]), float(st["rate"])))
        t0 += float(st["duration"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", default="../shared/data/replay")
    ap.add_argument("--warmup-s", type=float, default=60.0)
    args = ap.parse_args()
    print(
        "| experiment | rate/s | requests | TTFT min ms | p5 ms | median ms | mean ITL ms | p5 / ITL | median / ITL |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for d in experiment_dirs(args.data):
        e = load_experiment(d, LoadOptions(prompt_reuse="off"))
        ok = ~e.failed
        if e.n_failed > 0.01 * e.n_requests or np.nanmax(e.ttft_s[ok]) > 10:
            continue
        itl = (e.e2e_s - e.ttft_s) / np.maximum(e.output_tokens - 1, 1) * 1e3
        arrival = e.arrival_us / 1e6
        for start, end, rate in stages(read_json(d / "profile.json", ValueError, "profile")):
            sel = ok & (arrival >= start + args.warmup_s) & (arrival < end)
            if sel.sum() < 20:
                continue
            t = e.ttft_s[sel] * 1e3
            p5, med, mean_itl = np.percentile(t, 5), np.median(t), itl[sel].mean()
            print(
                f"| {e.name} | {rate:g} | {int(sel.sum())} | {t.min():.1f} | {p5:.1f} | {med:.1f} | {mean_itl:.2f} | "
                f"{p5 / mean_itl:.2f} | {med / mean_itl:.2f} |"
            )


if __name__ == "__main__":
    main()
