"""Where replays run: threads on this machine (the default) or tasks on a Ray cluster.

The engine hands every replay to an executor as a job: a module-level function of (experiment,
*args) and its arguments. Executors return the results in job order, so what a fit, a search or
a CV decides from them does not depend on where or in what order the jobs ran: the archive is the
same bit for bit on threads and on any cluster size.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.errors import UserError

Job = tuple[Experiment, tuple]  # fn(experiment, *args)
CLUSTER_FORMS = "ray://HOST:PORT (a cluster's Ray Client server), HOST:PORT (its GCS, from a node of it) or auto"
_ADDRESS = re.compile(r"^(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


class ClusterError(UserError):
    """The cluster cannot be used, or was lost mid-run: one line, with what to do."""


@dataclass(frozen=True)
class Cluster:
    """Where replays run instead of local threads: a Ray address and how many replays to keep in
    flight there (None: the cluster's CPUs)."""

    address: str
    remote_workers: int | None = None

    @classmethod
    def of(cls, address: str | None, remote_workers: int | None = None) -> Cluster | None:
        """From the command-line options, checked (before any data is read)."""
        if address is None:
            if remote_workers is not None:
                raise ClusterError("--remote-workers needs --cluster (without a cluster, --workers sets the threads)")
            return None
        check_cluster(address)
        return cls(address, remote_workers)


class LocalExecutor:
    """A thread pool: the replay loop is numba code that releases the GIL, so threads use every
    core without copying experiments into worker processes."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="replay")

    def map(self, fn: Callable[..., Any], jobs: list[Job]) -> list:
        """Results in job order; the jobs are started longest first (by output tokens to replay),
        so no thread is left with a long replay while the others wait (a tenth of a fit's
        evaluation on the real data is one experiment)."""
        order = sorted(range(len(jobs)), key=lambda i: -jobs[i][0].replay_cost)
        futures = {i: self.pool.submit(fn, jobs[i][0], *jobs[i][1]) for i in order}
        return [futures[i].result() for i in range(len(jobs))]

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def check_cluster(cluster: str | None) -> None:
    """A ClusterError for an address of no accepted form, or without Ray installed (commands
    check this before reading any data)."""
    if cluster is None:
        return
    if not (cluster == "auto" or _ADDRESS.match(cluster)):
        raise ClusterError(f"--cluster {cluster!r}: not a cluster address; use {CLUSTER_FORMS}")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ClusterError(
            "--cluster needs Ray, an optional extra: pip install 'stepml-evolve[ray]' "
            "(from a checkout: pip install '.[ray]')"
        ) from None
