"""`evolve bench --cluster`: replays/s and search generations/hour on local threads against a Ray
cluster, for each number of replays in flight there, in one run."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import compile_program, load_program
from stepml_evolve.evaluator.replay.executor import Cluster
from stepml_evolve.evaluator.say import Say
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.seeds import seed_path

from .bench import BENCH_PROGRAM, default_bench_data, timed_search

POPULATION = 8  # constant vectors per timed batch: one CMA-ES generation of a 4-constant program


def _population(constants: np.ndarray) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [constants * np.exp(rng.normal(0, 0.2, constants.size)) for _ in range(POPULATION)]


def _throughput(pool: ReplayPool, compiled, population, experiments, repeat: int) -> tuple[float, list[float]]:
    """Replays per second over `repeat` batches of population x experiments, and the batch's losses."""
    pool.population_losses(compiled, population, experiments)  # warm: numba and the workers' caches
    t0 = time.perf_counter()
    for _ in range(repeat):
        losses = pool.population_losses(compiled, population, experiments)
    return repeat * len(population) * len(experiments) / (time.perf_counter() - t0), losses


def cluster_bench(
    data: Path | None,
    cluster: Cluster,
    remote_workers: list[int],
    threads: int | None,
    generations: int,
    say: Say,
    program: str = BENCH_PROGRAM,
    repeat: int = 3,
) -> dict:
    """On `data` (default as for evolve bench): threads first, then the cluster at each count of
    remote workers; the cluster's losses must equal the threads' (reported as `identical`)."""
    loaded = load_data(data if data is not None else default_bench_data())
    exps = loaded.experiments
    prog = load_program(seed_path(program))
    compiled = compile_program(prog)
    population = _population(np.array(list(prog.constants.values()), dtype=float))
    rows = []

    def measure(pool: ReplayPool, where: str, workers: int) -> tuple[dict, list[float]]:
        rate, losses = _throughput(pool, compiled, population, exps, repeat)
        row = {"where": where, "workers": workers, "replays_per_s": round(rate, 1)}
        say(f"{where}, {workers} workers: {row['replays_per_s']} replays/s")
        if generations > 0:
            # generation 0 (the seed fits) with a small budget, one start each: only generations 1.. are compared
            timed = timed_search(loaded, pool, generations, say, seed_fit_evals=10, seed_starts=1)
            row.update({k: timed[k] for k in ("generations_per_hour", "generation_s_mean", "generations_timed")})
            say(f"{where}, {workers} workers: {row['generations_per_hour']} generations/hour")
        return row, losses

    with ReplayPool(exps, threads) as local:
        row, reference = measure(local, "threads", local.workers)
        rows.append(row)
    t0 = time.perf_counter()
    with ReplayPool(exps, cluster=Cluster(cluster.address)) as remote:
        connect_s = round(time.perf_counter() - t0, 2)
        say(
            f"connected to {cluster.address} ({remote.workers} CPUs) and stored {len(exps)} experiments in {connect_s} s"
        )
        cpus = remote.workers
        for n in remote_workers:
            remote.executor.workers = n
            row, losses = measure(remote, "ray", n)
            row["identical"] = losses == reference
            rows.append(row)
    base = rows[0]
    for row in rows[1:]:
        row["replays_vs_threads"] = round(row["replays_per_s"] / base["replays_per_s"], 2)
        if generations > 0:
            row["generations_vs_threads"] = round(row["generations_per_hour"] / base["generations_per_hour"], 2)
    return {
        "data": loaded.label,
        "synthetic": loaded.synthetic,
        "program": f"seeds/{program}.py",
        "cluster": cluster.address,
        "cluster_cpus": cpus,
        "connect_s": connect_s,
        "batch": f"{POPULATION} constant vectors x {len(exps)} experiments",
        "rows": rows,
    }
