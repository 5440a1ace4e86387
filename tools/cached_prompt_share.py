"""The share of prompt tokens the replay's prefix cache serves, per experiment, for one program:
against what a cache that never evicts would serve (`evolve data check`'s `cached %`).

    python tools/cached_prompt_share.py PROGRAM [DATA_DIR] [--prompt-reuse detect|system-prompt|off]

The replay's cache evicts (LRU) and loses prompts to preemption, so where KV binds (the overloaded
runs) it serves less; every admission counts, re-admissions after a preemption too.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from stepml_evolve.evaluator.data.experiment_reader import load_experiments
from stepml_evolve.evaluator.data.experiments import LoadOptions  # noqa: E402
from stepml_evolve.evaluator.data.prompt_reuse import DEFAULT_POLICY, POLICIES  # noqa: E402
from stepml_evolve.evaluator.dsl import compile_program, load_program  # noqa: E402
from stepml_evolve.evaluator.replay.closed_loop import replay  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program")
    ap.add_argument("data", nargs="?", default="../shared/data/replay")
    ap.add_argument("--prompt-reuse", default=DEFAULT_POLICY, choices=POLICIES)
    args = ap.parse_args()
    program = load_program(args.program)
    compiled, constants = compile_program(program), np.array(list(program.constants.values()), dtype=float)
    good, bad = load_experiments(args.data, LoadOptions(prompt_reuse=args.prompt_reuse))
    for e in bad:
        print(f"skipped: {e}", file=sys.stderr)
    print("| experiment | prompts | never-evicting cache % | replay's cache % | preemptions |")
    print("|---|---|---|---|---|")
    for e in good:
        res = replay(e, compiled, constants)
        r = e.prompt_reuse
        print(
            f"| {e.name} | {r.model}{f' {r.period}' if r.period else ''} | {r.cached_share * 100:.1f} | "
            f"{res.cached_share * 100:.1f} | {int(res.preemptions.sum())} |"
        )


if __name__ == "__main__":
    main()
