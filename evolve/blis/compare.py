"""Fidelity of an emitted model inside BLIS: the same program replayed by `blis replay` (the model
installed with `evolve emit-go --blis`) and by the tool's own replay (BLIS semantics), compared
per request and in the means, with the wall time of each.

Both replay the exported trace: the experiment's trace view (Experiment.trace_view), which is its
prompt sharing as far as a BLIS trace v2 can state it. How far that view moves the tool's own
predictions from the full workload model is reported beside (the workload gap)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stepml_evolve.evaluator.data.prompt_reuse import DEFAULT_POLICY
from stepml_evolve.evaluator.dsl import Program, compile_program
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.importers.blis_trace_export import (
    DEFAULT_LATENCY_MODEL,
    export_experiment_dir,
    load_for_export,
    read_blis_results,
)
from stepml_evolve.evaluator.replay.closed_loop import replay
from stepml_evolve.evaluator.replay.state import FINISHED


class BlisRunError(UserError):
    """`blis replay` failed; the message names the command's exit and its last output line."""


@dataclass(frozen=True)
class Fidelity:
    """One experiment: requests that succeeded in reality and finished in both replays."""

    experiment: str
    n_compared: int
    tool_finished: int
    blis_finished: int
    ttft_mean_ms: tuple[float, float]  # (tool, BLIS)
    e2e_mean_ms: tuple[float, float]
    exact_ttft: float  # share of compared requests equal to the microsecond
    exact_e2e: float
    tool_s: float  # wall time of one replay
    blis_s: float
    workload_gap_pct: tuple[float, float] = (
        0.0,
        0.0,
    )  # (TTFT, E2E): the tool's means on the trace view vs the full model

    @property
    def ttft_diff_pct(self) -> float:
        return (self.ttft_mean_ms[1] / self.ttft_mean_ms[0] - 1) * 100

    @property
    def e2e_diff_pct(self) -> float:
        return (self.e2e_mean_ms[1] / self.e2e_mean_ms[0] - 1) * 100

    def to_json(self) -> dict:
        return {
            "experiment": self.experiment,
            "n_compared": self.n_compared,
            "tool_finished": self.tool_finished,
            "blis_finished": self.blis_finished,
            "ttft_mean_ms": {"tool": self.ttft_mean_ms[0], "blis": self.ttft_mean_ms[1]},
            "e2e_mean_ms": {"tool": self.e2e_mean_ms[0], "blis": self.e2e_mean_ms[1]},
            "ttft_diff_pct": self.ttft_diff_pct,
            "e2e_diff_pct": self.e2e_diff_pct,
            "exact_ttft": self.exact_ttft,
            "exact_e2e": self.exact_e2e,
            "tool_s": self.tool_s,
            "blis_s": self.blis_s,
            "workload_gap_pct": {"ttft": self.workload_gap_pct[0], "e2e": self.workload_gap_pct[1]},
        }


def compare_with_blis(
    program: Program,
    exp_dir: Path,
    blis_checkout: Path,
    *,
    latency_model: str = DEFAULT_LATENCY_MODEL,
    requests: int | None = None,
    workdir: Path | None = None,
    timeout_s: float = 1800,
    prompt_reuse: str = DEFAULT_POLICY,
    floor: bool = True,
) -> Fidelity:
    """Replay `exp_dir` (its first `requests` requests, or all) through the BLIS checkout's binary with
    `--latency-model latency_model` (the program installed there) and through the tool's replay
    (floor: failing at a step below its physical floor, as the Go emitted under --physics check does)."""
    exp_dir, blis_checkout = Path(exp_dir), Path(blis_checkout)
    binary = blis_checkout / "blis"
    if not binary.is_file():
        raise BlisRunError(f"{binary}: no BLIS binary (build the checkout, e.g. evolve emit-go --blis {blis_checkout})")
    exp = load_for_export(exp_dir, prompt_reuse=prompt_reuse)  # once: the export and the tool's replay read it
    with tempfile.TemporaryDirectory(prefix="stepml-blis-", dir=workdir) as tmp:
        export = export_experiment_dir(
            exp_dir,
            Path(tmp) / "trace",
            experiment=exp,
            blis_dir=blis_checkout,
            latency_model=latency_model,
            requests=requests,
            binary=str(binary),
        )
        t0 = time.perf_counter()
        proc = subprocess.run(export.argv, capture_output=True, text=True, timeout=timeout_s, cwd=blis_checkout)
        blis_s = time.perf_counter() - t0
        if proc.returncode != 0:
            said = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()
            last = next((ln for ln in said if ln.startswith("panic: ")), said[-1])[:300]
            raise BlisRunError(f"blis replay on {exp_dir.name} exited {proc.returncode}: {last}")
        blis = read_blis_results(export.results)
    n = exp.n_requests if requests is None else min(requests, exp.n_requests)
    view, _ = exp.trace_view()
    if n < exp.n_requests:
        exp, view = exp.head(n), view.head(n)
    compiled = compile_program(program)
    constants = np.array(list(program.constants.values()), dtype=float)
    replay(view, compiled, constants, horizon=1)  # numba code loaded outside the timing
    t0 = time.perf_counter()
    res = replay(view, compiled, constants, semantics="blis", floor=floor)
    tool_s = time.perf_counter() - t0
    full = replay(exp, compiled, constants, semantics="blis", floor=floor)
    if not (res.ok and full.ok):
        raise BlisRunError(f"{exp_dir.name}: the tool's replay failed: {(res if not res.ok else full).failure()}")
    done = res.state == FINISHED
    ids = [i for i in np.flatnonzero(~exp.failed & done) if int(i) in blis]
    tool_ttft = np.array([res.ttft_us[i] for i in ids], dtype=float)
    tool_e2e = np.array([res.e2e_us[i] for i in ids], dtype=float)
    blis_ttft = np.array([blis[int(i)][0] for i in ids], dtype=float)
    blis_e2e = np.array([blis[int(i)][1] for i in ids], dtype=float)
    if not ids:
        raise BlisRunError(f"{exp_dir.name}: no request finished in both BLIS and the tool's replay")
    both = [i for i in ids if full.state[i] == FINISHED]
    gap = tuple(
        (np.mean(res_t[both]) / np.mean(full_t[both]) - 1) * 100 if both else float("nan")
        for res_t, full_t in ((res.ttft_us, full.ttft_us), (res.e2e_us, full.e2e_us))
    )
    return Fidelity(
        exp.name,
        len(ids),
        int(done.sum()),
        len(blis),
        (tool_ttft.mean() / 1e3, blis_ttft.mean() / 1e3),
        (tool_e2e.mean() / 1e3, blis_e2e.mean() / 1e3),
        float(np.mean(tool_ttft == blis_ttft)),
        float(np.mean(tool_e2e == blis_e2e)),
        tool_s,
        blis_s,
        (float(gap[0]), float(gap[1])),
    )


def compare_program_in_blis(
    spec: str,
    archive_dir: Path | None,
    blis_checkout: Path,
    experiment_dirs: list[Path],
    *,
    backend: str | None = None,
    requests: int | None = None,
    say=lambda line: None,
    prompt_reuse: str = DEFAULT_POLICY,
    physics: str = "check",
) -> list[Fidelity]:
    """`evolve blis-compare`: install the program (best, an id, or a file) into the checkout as
    `emit-go --blis` does (without BLIS's tests), then compare it on each experiment directory."""
    from stepml_evolve.evolve.go.emission import program_for_emission

    from .install import DEFAULT_BACKEND, install_into_blis

    program, _ = program_for_emission(spec, archive_dir, physics=physics)
    install_into_blis(
        spec, archive_dir, blis_checkout, backend=backend or DEFAULT_BACKEND, go_test=(), say=say, physics=physics
    )
    return [
        compare_with_blis(
            program,
            d,
            blis_checkout,
            latency_model=backend or DEFAULT_BACKEND,
            requests=requests,
            prompt_reuse=prompt_reuse,
            floor=physics == "check",
        )
        for d in experiment_dirs
    ]
