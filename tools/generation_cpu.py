"""Where a search's CPU goes (issue 25): `evolve run` with the thread CPU time (time.thread_time)
of its parts summed over every thread, printed when the run ends. A profiler's samples count a
thread that waits for a core as busy; this counts only the CPU each part used.

    python tools/generation_cpu.py run --generations 75 --seed 7 --data ../shared/data/replay \
        --archive COPY --resume --front-cv none

(COPY: a copy of a run's archive, so the generations measured are ones it already ran, and the
programs can be compared with the original's.)
"""

from __future__ import annotations

import argparse
import atexit
import collections
import sys
import threading
import time

from stepml_evolve.evaluator.fit import fitting
from stepml_evolve.evaluator.scoring import pool, surrogate
from stepml_evolve.evolve.cli import main


def _help_only(argv: list[str]) -> None:
    """`-h`/`--help` as the first argument prints this script's help and exits; any other command
    line goes to `evolve` unchanged (`generation_cpu.py run --help` prints `evolve run`'s)."""
    if argv[:1] not in (["-h"], ["--help"]):
        return
    ap = argparse.ArgumentParser(
        prog="generation_cpu.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("evolve_args", nargs=argparse.REMAINDER, help="an evolve command line, passed to evolve unchanged")
    ap.parse_args(argv)


if __name__ == "__main__":
    _help_only(sys.argv[1:])

_cpu: collections.Counter = collections.Counter()
_calls: collections.Counter = collections.Counter()
_lock = threading.Lock()


def _timed(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            with _lock:
                _cpu[label] += time.thread_time() - t0
                _calls[label] += 1

    setattr(owner, name, timed)


_timed(surrogate, "replay", "closed-loop replay inside record")
_timed(pool, "record", "record (replay, metric row)")
_timed(surrogate.PendingModel, "_build", "trajectory models built (fit starts and accepted points)")
_timed(pool, "_replay_rows", "scoring replays (every split)")
_timed(pool, "_replay_row", "population replays (plain)")
_timed(fitting._GroupFit, "surrogate_losses", "surrogate scoring")
_timed(fitting._GroupFit, "sampled_step", "surrogate step (CMA-ES and scoring)")
_start, _start_cpu = time.perf_counter(), time.process_time()


@atexit.register
def _report() -> None:
    wall, cpu = time.perf_counter() - _start, time.process_time() - _start_cpu
    print(f"wall {wall:.1f} s, process CPU {cpu:.1f} s", file=sys.stderr)
    for label in sorted(_cpu):
        print(f"  {label}: {_cpu[label]:.1f} CPU s over {_calls[label]} calls", file=sys.stderr)


if __name__ == "__main__":
    sys.argv = ["evolve", *sys.argv[1:]]
    main()
