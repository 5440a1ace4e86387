"""Replays as Ray tasks (imported only with --cluster; Ray is the optional extra `.[ray]`).

What travels: each experiment is put into the cluster's object store once per connection; a
worker process reads it once and keeps it. A task then carries a reference to it, the program's
compiled form (the validated bytecode and numexpr statements the DSL compiler produced, a few
KB: never program text, so workers execute nothing a user or an LLM wrote), the constant
vector, the split labels when a fit scores a window of the experiment, and the split names.
Results are metric rows (a few hundred bytes) or, for a trust-region step, the experiment's
trajectory model (tens of KB).

Faults: a task whose worker process dies is retried by Ray (up to TASK_RETRIES times); its
result is the same, since a replay is a pure function of its inputs. Losing the cluster (the
head node, the connection) raises ClusterError: the run stops with one line and the archive
holds every generation that completed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayError, RayTaskError

from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.replay.executor import ClusterError, Job

TASK_RETRIES = 5
# Ray Client's server starts a process per client session, which now and then dies at start
# with "Initialization failure from server", most often on a head started moments ago on a busy
# machine (its services are still coming up): that failure, and any that comes back within
# QUICK_FAILURE_S (the server answered), is retried with a doubling wait (2+4+8+16 s); a timeout
# is not.
CONNECT_ATTEMPTS, QUICK_FAILURE_S = 5, 10.0
SESSION_FAILURE = "Initialization failure from server"  # Ray Client's message for that case
# A task is a run of consecutive jobs, about this many tasks per worker and call: one replay per
# task spends more on Ray's per-task cost than on the replay (measured through Ray Client on 2
# cores: a quick and a short fit of the synthetic sample took 15.2 s against 4.3 s on threads).
TASKS_PER_WORKER = 3
# No wait on the cluster outlasts this: a task of replays takes seconds (the largest real experiment
# replays in 0.05 s), so a batch with no answer for this long is a cluster that hangs, not one that
# works; the run stops in one line (every completed generation is in the archive) instead of waiting
# without limit. The code check on connecting gets CHECK_DEADLINE_S.
RAY_DEADLINE_S = 900.0
CHECK_DEADLINE_S = 120.0
_CACHED: dict[str, Experiment] = {}  # in a worker process: object id -> experiment
_CACHE_LIMIT = 256


def code_fingerprint() -> str:
    """Hash of the evaluator's source: a driver and workers with different code would not give the same replays."""
    root = Path(__file__).resolve().parent.parent  # evaluator/
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".yaml")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _experiment(box: list, split: np.ndarray | None) -> Experiment:
    ref = box[0]
    key = ref.hex()
    exp = _CACHED.get(key)
    if exp is None:
        if len(_CACHED) >= _CACHE_LIMIT:
            _CACHED.clear()
        exp = _CACHED[key] = ray.get(ref)
    return exp if split is None else dataclasses.replace(exp, split=split)


@ray.remote(max_retries=TASK_RETRIES, retry_exceptions=False)
def _run_jobs(fn: Callable[..., Any], jobs: list[tuple[list, np.ndarray | None, tuple]]) -> list:
    # references travel inside lists so Ray does not fetch them per task: the worker's cache does
    return [fn(_experiment(box, split), *args) for box, split, args in jobs]


@ray.remote(max_retries=TASK_RETRIES)
def _worker_fingerprint() -> str:
    # Ray Client ships a remote function by value, with the globals it reads: import the
    # worker's own module, or this would hash the driver's code
    import importlib

    return importlib.import_module(__name__).code_fingerprint()


def _quiet_closed_channels() -> None:
    """gRPC polls a channel's state from a thread of its own; when the head goes away, that thread
    dies with "Channel closed" and Python prints its traceback, after or around the one-line
    ClusterError the run stops with. Drop exactly that exception; any other goes to the old hook."""
    previous = threading.excepthook
    if getattr(previous, "_drops_closed_channels", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        in_grpc = any(
            "/grpc/" in frame.f_code.co_filename.replace("\\", "/")
            for frame, _ in traceback.walk_tb(args.exc_traceback)
        )
        if not (in_grpc and args.exc_type is ValueError and "Channel closed" in str(args.exc_value)):
            previous(args)

    hook._drops_closed_channels = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class RayExecutor:
    def __init__(self, experiments: list[Experiment], cluster: str, remote_workers: int | None = None):
        self.cluster = cluster
        _quiet_closed_channels()
        logging.getLogger("ray").setLevel(
            logging.ERROR
        )  # its notices; what goes wrong reaches the user as a ClusterError
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            t0 = time.monotonic()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ray.init(address=cluster, logging_level=logging.ERROR, log_to_driver=False)
                break
            except (ConnectionError, RayError, RuntimeError, ValueError) as e:
                ray.shutdown()
                # A server that answered and then failed to start this client's session is
                # worth another try; one that did not answer (a timeout) is not.
                answered = time.monotonic() - t0 < QUICK_FAILURE_S or SESSION_FAILURE in str(e)
                if attempt == CONNECT_ATTEMPTS or not answered:
                    raise ClusterError(
                        f"--cluster {cluster}: cannot connect to a Ray cluster there ({_one_line(e)}); "
                        "start one with `ray start --head` (see the README)"
                    ) from None
                time.sleep(2**attempt)
        try:
            cpus = int(ray.cluster_resources().get("CPU", 0))
            if cpus < 1:
                raise ClusterError(f"--cluster {cluster}: the cluster has no CPUs to run replays on")
            self.workers = remote_workers or cpus
            self._check_code()
            self._base = {e.name: e for e in experiments}
            self._refs = {e.name: ray.put(e) for e in experiments}
            self._extra: dict[int, tuple[Experiment, Any]] = {}  # id -> (experiment, ref) for non-base experiments
        except (RayError, ConnectionError) as e:
            ray.shutdown()
            raise ClusterError(f"--cluster {cluster}: lost the cluster while setting up ({_one_line(e)})") from None
        except BaseException:
            ray.shutdown()
            raise

    def _check_code(self) -> None:
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        checks = [
            _worker_fingerprint.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote()
            for n in nodes
        ]
        try:
            prints = ray.get(checks, timeout=CHECK_DEADLINE_S)
        except GetTimeoutError:
            _cancel(checks)
            raise ClusterError(
                f"--cluster {self.cluster}: its nodes did not answer the code check within {CHECK_DEADLINE_S:g} s"
            ) from None
        mine = code_fingerprint()
        other = sorted({p for p in prints if p != mine})
        if other:
            raise ClusterError(
                f"--cluster {self.cluster}: {len([p for p in prints if p != mine])} of {len(nodes)} nodes run a "
                f"different stepml-evolve evaluator (code {other[0]}, here {mine}); install this version on "
                "every node, or their replays would differ"
            )

    def _handle(self, exp: Experiment) -> tuple[Any, np.ndarray | None]:
        """(object reference, split override): a base experiment or a windowed copy of one travels
        as its stored reference (plus the copy's split labels); anything else is put once."""
        base = self._base.get(exp.name)
        if base is exp:
            return self._refs[exp.name], None
        if base is not None and all(
            getattr(exp, f.name) is getattr(base, f.name) or f.name == "split" for f in dataclasses.fields(Experiment)
        ):
            return self._refs[exp.name], exp.split
        held = self._extra.get(id(exp))
        if held is None or held[0] is not exp:
            held = self._extra[id(exp)] = (exp, ray.put(exp))
        return held[1], None

    def map(self, fn: Callable[..., Any], jobs: list[Job]) -> list:
        try:
            items = []
            for exp, args in jobs:
                ref, split = self._handle(exp)
                items.append(([ref], split, args))
            n_tasks = min(len(items), self.workers * TASKS_PER_WORKER)
            bounds = np.linspace(0, len(items), n_tasks + 1).round().astype(int)
            refs, in_flight = [], []
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                if len(in_flight) >= self.workers:
                    done, in_flight = ray.wait(in_flight, num_returns=1, timeout=RAY_DEADLINE_S)
                    if not done:
                        raise GetTimeoutError(f"no task of the batch finished within {RAY_DEADLINE_S:g} s")
                refs.append(_run_jobs.remote(fn, items[lo:hi]))
                in_flight.append(refs[-1])
            return [r for chunk in ray.get(refs, timeout=RAY_DEADLINE_S) for r in chunk]
        except GetTimeoutError:
            _cancel(refs)
            raise ClusterError(
                f"the Ray cluster at {self.cluster} answered no batch of replays within {RAY_DEADLINE_S:g} s (a hung "
                "node?); every completed generation is in the archive: run the same command with --resume"
            ) from None
        except RayTaskError as e:  # the replay itself raised: the same error a thread would have raised
            raise e.cause if isinstance(e.cause, BaseException) else e from None
        except Exception as e:
            # Ray Client reports a connection lost mid-call as a plain Exception ("Client Wait
            # request failed. Reference invalid?"), not as a RayError; while it waits to reconnect
            # it may still look connected, so where the exception was raised decides
            if not isinstance(e, (RayError, ConnectionError)) and not from_ray_client(e) and _connected():
                raise
            raise ClusterError(
                f"lost the Ray cluster at {self.cluster} ({_one_line(e)}); every completed generation "
                "is in the archive: run the same command with --resume, here or on a new cluster"
            ) from None

    def close(self) -> None:
        self._extra.clear()
        try:
            ray.shutdown()
        except Exception:  # a cluster already gone has nothing left to shut down
            pass


def _cancel(refs: list) -> None:
    """Cancel the tasks still running (a timed-out batch leaves no task to hold a worker)."""
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # finished, or the cluster is gone: nothing to cancel
            pass


def _connected() -> bool:
    """Whether this driver still reaches its cluster (through Ray Client or as a node of it)."""
    try:
        from ray.util.client import ray as client

        if client.is_connected():
            return bool(client.cluster_resources())
        return ray.is_initialized() and bool(ray.cluster_resources())
    except Exception:
        return False


def from_ray_client(e: BaseException) -> bool:
    """Whether `e` was raised inside Ray Client's own code (ray/util/client/): the transport to the
    cluster failed, whatever the message says."""
    tb = e.__traceback__
    while tb is not None:
        if "/ray/util/client/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        tb = tb.tb_next
    return False


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."
