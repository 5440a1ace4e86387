"""Replays on a real two-node Ray cluster on 127.0.0.1 (tests/ray_cluster.py): the same archive
and constants as local threads whatever the cluster size, a killed worker retried, a lost head
reported in one line and resumed locally with nothing lost, `bench --cluster`, and the errors.

Needs the extra `.[ray]`; CI installs it and sets STEPML_REQUIRE_RAY=1, so there these tests fail
rather than skip without Ray."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, TINY_BUDGETS, only_error_line, snapshot
from typer.testing import CliRunner

from stepml_evolve.archive.store import Archive
from stepml_evolve.evolve.cli.app import app

try:
    import ray  # noqa: F401

    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False
    if os.environ.get("STEPML_REQUIRE_RAY"):
        raise

needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (pip install '.[ray]')")

SMALL = [*TINY_BUDGETS, "--front-cv", "none"]
GENERATIONS = "1"
SEED = "3"
ROOFLINE = str(ROOT / "seeds" / "roofline.py")


def run_args(archive, *extra):
    return ["run", "--generations", GENERATIONS, "--seed", SEED, "--archive", str(archive), *SMALL, *extra]


def evolve_process(args, **env):
    """`evolve ARGS` in its own process, as a user runs it (Ray's driver state stays out of pytest's)."""
    return subprocess.Popen(
        [sys.executable, "-m", "stepml_evolve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def last_generation(archive_dir) -> int | None:
    path = archive_dir / Archive.FILE
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(path, timeout=1)
        try:
            return db.execute("SELECT MAX(generation) FROM generations").fetchone()[0]
        finally:
            db.close()
    except sqlite3.OperationalError:
        return None


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run on local threads."""
    d = tmp_path_factory.mktemp("local")
    res = CliRunner().invoke(app, run_args(d))
    assert res.exit_code == 0, res.output
    return snapshot(d)


@pytest.fixture(scope="module")
def cluster():
    if not HAVE_RAY:
        pytest.skip("Ray is not installed (pip install '.[ray]')")
    from ray_cluster import LocalCluster

    with LocalCluster(nodes=2, cpus_per_node=1) as c:
        yield c


@pytest.fixture(scope="module")
def cluster_run(cluster, tmp_path_factory):
    """One run on the two-node cluster in which two replay tasks are killed with SIGKILL mid-flight, the
    second after generation 0 is in the archive (both tests below read it: one run's cost instead of
    two). The first may be one of generation 0's seed fits: the later generations' tiny fits can
    end between two looks at the cluster's processes."""
    d = tmp_path_factory.mktemp("cluster-run")
    proc = evolve_process(run_args(d, "--cluster", cluster.client, "--remote-workers", "2"))
    killed = []

    def killer():
        deadline = time.time() + 600
        while proc.poll() is None and time.time() < deadline and len(killed) < 2:
            gen = last_generation(d)
            done = -1 if gen is None else gen  # the last generation in the archive
            busy = cluster.task_processes() if done >= len(killed) - 1 else []
            if busy:
                os.kill(busy[0], signal.SIGKILL)
                killed.append(busy[0])
            time.sleep(0.05)

    thread = threading.Thread(target=killer)
    thread.start()
    out, err = proc.communicate(timeout=900)
    thread.join()
    if proc.returncode:
        err = f"{err[-3000:]}\n{cluster.client_server_logs()}"
    return {"returncode": proc.returncode, "err": err, "killed": killed, "snapshot": snapshot(d)}


@needs_ray
def test_a_run_on_a_two_node_cluster_writes_the_local_archive(cluster_run, reference):
    assert cluster_run["returncode"] == 0, cluster_run["err"]
    assert cluster_run["snapshot"] == reference


@needs_ray
def test_a_fit_gives_the_same_constants_on_threads_and_any_cluster_size(cluster, tmp_path):
    def fitted(*extra):
        out = tmp_path / f"fit{len(list(tmp_path.iterdir()))}.py"
        res = CliRunner().invoke(
            app, ["fit", ROOFLINE, "--max-evals", "6", "--seed", "2", "--out", str(out), "--json", *extra]
        )
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        return doc["train_loss"], doc["constants"], doc["splits"], out.read_text()

    local = fitted("--workers", "1")
    for n in ("1", "3"):
        assert fitted("--cluster", cluster.client, "--remote-workers", n) == local


@needs_ray
def test_a_killed_worker_is_retried_and_the_archive_is_unchanged(cluster_run, reference):
    assert cluster_run["killed"], f"no replay task was seen running on the cluster: {cluster_run['err'][-3000:]}"
    assert cluster_run["returncode"] == 0, cluster_run["err"]
    assert cluster_run["snapshot"] == reference


@needs_ray
def test_a_lost_head_stops_the_run_in_one_line_and_resume_finishes_it_locally(reference, tmp_path):
    from ray_cluster import LocalCluster

    with LocalCluster(nodes=2, cpus_per_node=1) as doomed:
        # Ray Client waits this long for a lost connection to come back (default 30 s)
        proc = evolve_process(run_args(tmp_path, "--cluster", doomed.client), RAY_CLIENT_RECONNECT_GRACE_PERIOD="5")
        deadline = time.time() + 600
        while proc.poll() is None and time.time() < deadline:
            gen = last_generation(tmp_path)
            if gen is not None and gen >= 0:
                doomed.lose_head()
                break
            time.sleep(0.1)
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: lost the Ray cluster at ray://127.0.0.1:") and "--resume" in lines[-1], err[
        -3000:
    ]
    assert sum(ln.startswith("error:") for ln in lines) == 1 and "Traceback" not in err
    partial = snapshot(tmp_path)
    last = partial["generations"][-1][0]
    assert last < int(GENERATIONS) and all(p[1] <= last for p in partial["programs"])
    assert partial["programs"] == reference["programs"][: len(partial["programs"])]
    res = CliRunner().invoke(app, run_args(tmp_path, "--resume"))
    assert res.exit_code == 0, res.output
    assert snapshot(tmp_path) == reference


@needs_ray
def test_a_closed_grpc_channel_in_a_background_thread_prints_nothing(monkeypatch):
    """What made a lost head print a traceback beside its one line: gRPC's connectivity-poll thread
    dies with "Channel closed". That exception is dropped; any other thread's error still reaches
    the hook that was there before (Python's, which prints it)."""
    from stepml_evolve.evaluator.replay.ray_executor import _quiet_closed_channels

    shown = []
    monkeypatch.setattr(threading, "excepthook", lambda args: shown.append(str(args.exc_value)))
    _quiet_closed_channels()
    _quiet_closed_channels()  # idempotent: one hook, not a chain of them

    def raise_in(filename, message):
        code = compile(f"def poll():\n    raise ValueError({message!r})\n", filename, "exec")
        space: dict = {}
        exec(code, space)  # a function whose frame claims to be in FILENAME, as gRPC's are
        t = threading.Thread(target=space["poll"])
        t.start()
        t.join()
        return shown.pop() if shown else None

    assert raise_in("/venv/site-packages/grpc/_channel.py", "Cannot invoke RPC: Channel closed!") is None
    assert raise_in("/venv/site-packages/other/poll.py", "Channel closed!") == "Channel closed!"
    assert raise_in("/venv/site-packages/grpc/_channel.py", "bad state") == "bad state"


@needs_ray
def test_bench_compares_threads_and_each_count_of_remote_workers(cluster):
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--cluster",
            cluster.client,
            "--remote-workers",
            "1",
            "--remote-workers",
            "2",
            "--search-generations",
            "1",
            "--workers",
            "2",
            "--json",
            "--data",
            str(_synthetic_dir()),
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = doc["rows"]
    assert [(r["where"], r["workers"]) for r in rows] == [("threads", 2), ("ray", 1), ("ray", 2)]
    assert doc["cluster_cpus"] == 2
    assert all(r["replays_per_s"] > 0 and r["generations_per_hour"] > 0 for r in rows)
    assert all(r["identical"] for r in rows[1:])
    assert all(r["replays_vs_threads"] == round(r["replays_per_s"] / rows[0]["replays_per_s"], 2) for r in rows[1:])


def _synthetic_dir():
    from stepml_evolve.evaluator.datasets import load_data

    return load_data(None).directory


# ---- errors: one line, nothing read or written ----


def test_a_bad_cluster_address_is_one_line(tmp_path):
    res = CliRunner().invoke(app, run_args(tmp_path / "a", "--cluster", "not an address"))
    only_error_line(res, "--cluster 'not an address'", "ray://HOST:PORT")
    assert not (tmp_path / "a").exists()


def test_remote_workers_need_a_cluster(tmp_path):
    res = CliRunner().invoke(app, ["fit", ROOFLINE, "--remote-workers", "2", "--out", str(tmp_path / "f.py")])
    only_error_line(res, "--remote-workers needs --cluster")


def test_without_ray_cluster_names_the_extra(tmp_path):
    """Ray made unimportable in a fresh interpreter, as on an install without the extra."""
    code = (
        "import sys\n"
        "class NoRay:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ImportError('No module named ray')\n"
        "sys.meta_path.insert(0, NoRay())\n"
        "from stepml_evolve.evolve.cli import main\n"
        f"sys.argv = ['evolve', 'fit', {ROOFLINE!r}, '--cluster', 'ray://127.0.0.1:10001', '--out', {str(tmp_path / 'f.py')!r}]\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --cluster needs Ray, an optional extra: pip install "
        "'stepml-evolve[ray]' (from a checkout: pip install '.[ray]')"
    )
    assert not (tmp_path / "f.py").exists()


@needs_ray
def test_an_unreachable_cluster_is_one_line(tmp_path, monkeypatch):
    import ray.util.client.worker as ray_client
    from ray_cluster import free_port

    from stepml_evolve.evaluator.replay import ray_executor

    # Ray Client waits 5 + 10 + 15 s for a server that is not there; a second each says the same.
    # A failure within QUICK_FAILURE_S counts as a server that answered (retried): below those 3 s here
    monkeypatch.setattr(ray_client, "INITIAL_TIMEOUT_SEC", 1)
    monkeypatch.setattr(ray_client, "MAX_TIMEOUT_SEC", 1)
    monkeypatch.setattr(ray_executor, "QUICK_FAILURE_S", 2.0)
    port = free_port()
    res = CliRunner().invoke(
        app, ["fit", ROOFLINE, "--cluster", f"ray://127.0.0.1:{port}", "--out", str(tmp_path / "f.py")]
    )
    only_error_line(res, f"--cluster ray://127.0.0.1:{port}: cannot connect to a Ray cluster there")
    assert not (tmp_path / "f.py").exists()


@needs_ray
def test_a_cluster_running_other_evaluator_code_is_refused(cluster, monkeypatch, tmp_path):
    """This process's evaluator hash is changed; the workers compute theirs from the installed source."""
    from stepml_evolve.evaluator.replay import ray_executor

    monkeypatch.setattr(ray_executor, "code_fingerprint", lambda: "0123456789abcdef")
    res = CliRunner().invoke(
        app, ["fit", ROOFLINE, "--cluster", cluster.client, "--max-evals", "2", "--out", str(tmp_path / "f.py")]
    )
    only_error_line(res, "2 of 2 nodes run a different stepml-evolve evaluator", "here 0123456789abcdef")
    assert not (tmp_path / "f.py").exists()


@needs_ray
def test_a_batch_the_cluster_never_answers_ends_at_the_deadline_in_one_line(cluster, monkeypatch):
    """No wait on the cluster outlasts RAY_DEADLINE_S: a task that hangs ends the call with a
    ClusterError (the run stops in one line; --resume continues), and the task is cancelled."""
    import time

    from stepml_evolve.evaluator.datasets import load_data
    from stepml_evolve.evaluator.replay import ray_executor

    monkeypatch.setattr(ray_executor, "RAY_DEADLINE_S", 2.0)
    experiments = load_data(None).experiments[:1]
    executor = ray_executor.RayExecutor(experiments, cluster.client, 1)
    try:
        t0 = time.perf_counter()
        with pytest.raises(ray_executor.ClusterError, match="answered no batch of replays within 2 s"):
            executor.map(lambda exp, seconds: time.sleep(seconds), [(experiments[0], (20.0,))])
        assert time.perf_counter() - t0 < 15.0
    finally:
        executor.close()


@needs_ray
def test_an_error_raised_inside_ray_client_is_a_lost_cluster_whatever_it_says():
    """Ray Client raises a plain Exception ("Client Wait request failed. Reference invalid?") when
    the head goes during a wait, and may still look connected while it waits to reconnect: where
    the exception was raised decides, so the run stops in one line either way."""
    from stepml_evolve.evaluator.replay.ray_executor import from_ray_client

    def wait():
        raise Exception("Client Wait request failed. Reference invalid?")

    wait.__code__ = wait.__code__.replace(co_filename="/x/site-packages/ray/util/client/worker.py")
    for raiser, expected in ((wait, True), (lambda: 1 / 0, False)):
        try:
            raiser()
        except Exception as e:  # noqa: BLE001
            assert from_ray_client(e) is expected
