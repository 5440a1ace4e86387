"""A real two-node Ray cluster on 127.0.0.1 for the cluster tests (and by hand:
`python tests/ray_cluster.py [NODES [CPUS_PER_NODE]]`, default 2 nodes of 1 CPU).

Ray's own multi-node test harness (ray.cluster_utils.Cluster) starts a head node and a worker
node, each its own raylet with one CPU, in a child process of ours. Ray binds every server to the
node's address; with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 that address is the loopback one, so
nothing listens beyond 127.0.0.1. The child prints the addresses as one JSON line, removes the
head node on SIGUSR1 (a lost head), and shuts the cluster down on SIGTERM. The cluster counts as
started once a Ray Client session has opened on it: a head just up on a busy machine can refuse
the first sessions while its services start, and the tests are about our runs, not that.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
PROBE_S = 60  # a Ray Client session opens in seconds on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """`with LocalCluster() as c:` c.client is ray://127.0.0.1:PORT for --cluster."""

    def __init__(self, nodes: int = 2, cpus_per_node: int = 1, start_timeout_s: float = 120):
        self.nodes, self.cpus, self.timeout = nodes, cpus_per_node, start_timeout_s
        self.client_port = free_port()

    @property
    def client(self) -> str:
        return f"ray://127.0.0.1:{self.client_port}"

    def __enter__(self) -> LocalCluster:
        env = {**os.environ, **LOOPBACK_ONLY}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.client_port), str(self.nodes), str(self.cpus)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        deadline = time.time() + self.timeout
        line = ""
        while time.time() < deadline and not line:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the local Ray cluster did not start: {self.proc.stderr.read()[-2000:]}")
            line = self.proc.stdout.readline().strip()
        if not line:
            self.__exit__()
            raise RuntimeError(f"the local Ray cluster did not start in {self.timeout} s")
        self.info = json.loads(line)
        self._wait_for_a_session(deadline)
        return self

    def _wait_for_a_session(self, deadline: float) -> None:
        probe = f"import ray; ray.init(address={self.client!r}); ray.shutdown()"
        while True:
            # a session the client server starts can hang for good (seen once in 25 minutes of CI):
            # a probe gets PROBE_S, then another one is started
            try:
                res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=PROBE_S)
                if res.returncode == 0:
                    return
                why = res.stderr[-2000:]
            except subprocess.TimeoutExpired:
                why = f"a probe hung for {PROBE_S} s"
            if time.time() > deadline:
                self.__exit__()
                raise RuntimeError(f"no Ray Client session opened on the local cluster: {why}")
            time.sleep(2)

    def client_server_logs(self, chars: int = 3000) -> str:
        """The ends of the head's Ray Client server logs, for a failing test's message."""
        logs = sorted(Path(self.info["session_dir"], "logs").glob("ray_client_server*"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in logs if p.stat().st_size)

    def lose_head(self) -> None:
        """Kill the head node's processes (GCS, raylet, Ray Client server); the worker node stays."""
        self.proc.send_signal(signal.SIGUSR1)

    def task_processes(self, name: str = "_run_jobs") -> list[int]:
        """Worker processes of this cluster running a task `name` now (Ray sets their title to ray::<name>)."""
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    cmd = (d / "cmdline").read_bytes()
                except OSError:
                    continue
                if cmd.startswith(f"ray::{name}".encode()):
                    pids.append(int(d.name))
        return pids

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _serve(client_port: int, nodes: int, cpus: int) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": cpus, "ray_client_server_port": client_port, "include_dashboard": False},
    )
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus)
    cluster.wait_for_nodes()

    def lose_head(*_):
        cluster.remove_node(cluster.head_node, allow_graceful=False)

    def stop(*_):
        cluster.shutdown()
        sys.exit(0)

    signal.signal(signal.SIGUSR1, lose_head)
    signal.signal(signal.SIGTERM, stop)
    info = {"gcs": cluster.address, "client_port": client_port, "session_dir": cluster.head_node.get_session_dir_path()}
    print(json.dumps(info), flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        os.environ.update(LOOPBACK_ONLY)
        _serve(*map(int, sys.argv[2:5]))
    else:  # python tests/ray_cluster.py [NODES [CPUS_PER_NODE]]
        args = [int(a) for a in sys.argv[1:3]]
        with LocalCluster(*args) as c:
            print(f"{c.client} (GCS {c.info['gcs']}); Ctrl-C stops it", flush=True)
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
