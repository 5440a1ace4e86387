"""Closed-loop replay of one experiment with one program as the step-time model: `replay` runs the
scheduler (scheduler.py) and returns each request's TTFT and E2E and, when asked, the trajectory
(the scheduled request-slots of every step) that the fit's surrogate re-times."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepml_evolve.evaluator.choices import DEFAULT_SEMANTICS, SEMANTICS
from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.dsl.vm import CompiledProgram
from stepml_evolve.evaluator.hardware.components import coefficients
from stepml_evolve.evaluator.replay.scheduler import Simulation, _simulate
from stepml_evolve.evaluator.replay.state import (
    BAD_QUEUE_TIME,
    BAD_STEP_TIME,
    BELOW_FLOOR,
    DIAG_ADMITTED,
    DIAG_CACHED,
    DIAG_CTX_MAX,
    DIAG_FLOOR,
    DIAG_FUNCTION,
    DIAG_N_DC,
    DIAG_N_PF,
    DIAG_RUNS,
    DIAG_SIZE,
    DIAG_STRETCH,
    DIAG_TOK_PF,
    DIAG_VALUE,
    MAX_US,
    OK,
    STEP_LIMIT,
    TRAJECTORY_FULL,
)


@dataclass
class Trajectory:
    """Scheduled request-slots of every step (flat; None when replayed with rows=False), each
    request's runs of consecutive scheduled steps, and each step's start and duration (us)."""

    step: np.ndarray | None
    new_tokens: np.ndarray | None
    context: np.ndarray | None
    is_prefill: np.ndarray | None
    request: np.ndarray | None
    runs: np.ndarray  # (k, 3): request, first step, last step of each run (in the order they opened)
    step_start_us: np.ndarray
    step_us: np.ndarray
    kv_blocks_used: np.ndarray  # after the step's allocations
    running: np.ndarray  # requests in the running batch during the step
    totals: (
        np.ndarray
    )  # (steps, 7): the batch totals component_values takes (tok_pf, n_pf, pf_pairs, pf_ctx, n_dc, dc_ctx, ctx_max)

    @property
    def n_steps(self) -> int:
        return len(self.step_us)


@dataclass
class ReplayResult:
    status: int
    n_steps: int
    clock_us: int
    ttft_us: np.ndarray  # -1 where no first token
    e2e_us: np.ndarray  # -1 where not finished
    state: np.ndarray
    preemptions: np.ndarray
    trajectory: Trajectory | None = None
    bad_value: float = 0.0  # the offending value when status is BAD_STEP_TIME, BAD_QUEUE_TIME or BELOW_FLOOR
    bad_function: str = "step_time"
    cached_tokens: int = 0  # prompt tokens the prefix cache served at admissions (re-admissions after preemption too)
    admitted_prompt_tokens: int = 0  # prompt tokens of those admissions
    stretch_steps: int = 0  # steps taken as decode stretches (_decode_stretch), without visiting the batch
    floor_us: float = 0.0  # BELOW_FLOOR: the step's floor
    # BELOW_FLOOR: the step's prefill tokens and chunks, decodes and longest context
    bad_batch: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.admitted_prompt_tokens if self.admitted_prompt_tokens else 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK

    def failure(self) -> str:
        """One line saying what went wrong (empty when the replay succeeded)."""
        if self.status == BELOW_FLOOR:
            return (
                f"step_time returned {self.bad_value:.6g} us at step {self.n_steps} ({self.batch_text()}), "
                f"{self.bad_value / self.floor_us:.3g}x its physical floor of {self.floor_us:.6g} us (the roofline "
                "of the step's work at the hardware's peak): no step is faster than the hardware allows"
            )
        return {
            OK: "",
            BAD_STEP_TIME: f"step_time returned {self.bad_value:g} (must be finite, positive and at most {MAX_US:g} us) at step {self.n_steps}",
            STEP_LIMIT: f"simulation exceeded the step limit ({self.n_steps} steps)",
            BAD_QUEUE_TIME: f"{self.bad_function} returned {self.bad_value:g} (must be finite, at least 0 and at most {MAX_US:g} us)",
            TRAJECTORY_FULL: "trajectory buffer full",
        }[self.status]

    def batch_text(self) -> str:
        tok_pf, n_pf, n_dc, ctx_max = self.bad_batch
        parts = [f"prefill {tok_pf:,} tokens in {n_pf} chunk{'s' * (n_pf != 1)}"] if n_pf else []
        parts += [f"{n_dc} decode{'s' * (n_dc != 1)}"] if n_dc else []
        return " + ".join(parts or ["an empty batch"]) + f", longest context before it {ctx_max:,} tokens"


_COEF_CACHE: dict[tuple, np.ndarray] = {}


def experiment_coefficients(exp: Experiment) -> np.ndarray:
    key = (exp.arch, exp.hardware, exp.tp)  # by value: experiment objects come and go (windowed copies)
    if key not in _COEF_CACHE:
        _COEF_CACHE[key] = coefficients(exp.arch, exp.hardware, exp.tp)
    return _COEF_CACHE[key]


def key_layout(exp: Experiment) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The prefix cache's content keys for `exp` (see above): per group its blocks and first key,
    per request the first key of its prompt's own blocks, and how many keys there are. Requests
    that sent one prompt share its keys; each prompt has room for its full prompt blocks."""
    block = exp.server.block_size
    gblocks = np.array([t // block for t in exp.group_tokens] or [0], dtype=np.int64)
    goff = np.concatenate(([0], np.cumsum(gblocks)[:-1])).astype(np.int64)
    n_group_keys = int(gblocks.sum())
    which, ids = pd.factorize(exp.prompt, sort=True)  # np.unique(return_inverse=True)'s labels, faster
    room = np.zeros(len(ids), dtype=np.int64)
    np.maximum.at(room, which, exp.input_tokens // block + 1)
    poff = np.concatenate(([0], np.cumsum(room)))
    return gblocks, goff, (n_group_keys + poff[which]).astype(np.int64), int(n_group_keys + poff[-1])


def replay(
    exp: Experiment,
    program: CompiledProgram,
    constants,
    horizon: int | None = None,
    record: bool = False,
    max_steps: int = 50_000_000,
    semantics: str = DEFAULT_SEMANTICS,
    rows: bool = True,
    floor: bool = False,
) -> ReplayResult:
    """Replay `exp` closed-loop with `program` at `constants` (array in program order).

    horizon: stop once every request at arrival position < horizon finished or timed out
    (requests after it still arrive and compete until then). record: keep the trajectory;
    rows=False keeps it without its request-slot rows (one per scheduled request per step, tens
    of millions on the real data), only the steps and each request's runs of steps.
    semantics: "blis" (as BLIS accounts a step, so fitted constants mean the same in the
    simulator) or "vllm" (see SEMANTICS). floor: a step below its physical floor (the roofline of its
    work at peak, soundness/floor.py) stops the replay (BELOW_FLOOR, naming the step), as under
    --physics check; off, only a duration that is not finite and positive does.
    """
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {', '.join(SEMANTICS)}, not {semantics!r}")
    n = exp.n_requests
    horizon = n if horizon is None else int(min(max(horizon, 0), n))
    rows = rows and record  # rows are part of a recording
    consts = np.ascontiguousarray(constants, dtype=np.float64)
    if consts.shape != (len(program.constant_names),):
        raise ValueError(f"expected {len(program.constant_names)} constants, got shape {consts.shape}")
    s = exp.server
    gblocks, goff, pkey, key_space = key_layout(exp)
    # trajectory buffers sized for every output token plus a prefill chunk per request, runs for
    # a few (re)admissions per request (grown on overflow)
    cap = int(exp.output_tokens.sum()) + 4 * n + 1024 if record else 1
    run_cap = 4 * n + 1024 if record else 1
    while True:
        sim = Simulation(
            arrival=exp.arrival_us,
            inputs=exp.input_tokens,
            outputs=exp.output_tokens,
            abort_after=exp.abort_after_us,
            keys=(exp.prefix_group, gblocks, goff, pkey),
            key_space=key_space,
            max_seqs=s.max_num_seqs,
            budget_tokens=s.max_num_batched_tokens,
            kv_blocks=s.kv_blocks,
            block=s.block_size,
            blis=semantics == "blis",
            k=experiment_coefficients(exp),
            code=program.code,
            lits=program.literals,
            entries=program.entries,
            consts=consts,
            floor_check=floor,
            horizon=horizon,
            max_steps=max_steps,
            record=record,
            rows=rows,
            ttft=np.full(n, -1, np.int64),
            e2e=np.full(n, -1, np.int64),
            state=np.zeros(n, np.int8),
            preempts=np.zeros(n, np.int32),
            traj=np.zeros((cap if rows else 1, 5), np.int64),
            runs=np.zeros((run_cap, 3), np.int64),
            steps_rec=np.zeros((cap, 4), np.int64),
            totals_rec=np.zeros((cap, 7)),
            diag=np.zeros(DIAG_SIZE),
        )
        status, steps, clock, n_rec = _simulate(*sim)
        if status != TRAJECTORY_FULL:
            break
        cap, run_cap = max(cap * 4, 1 << 20), run_cap * 4
    trajectory = None
    diag = sim.diag
    if record and status == OK:
        t = sim.traj[:n_rec] if rows else None
        trajectory = Trajectory(
            step=t[:, 0] if rows else None,
            new_tokens=t[:, 1] if rows else None,
            context=t[:, 2] if rows else None,
            is_prefill=t[:, 3].astype(bool) if rows else None,
            request=t[:, 4] if rows else None,
            runs=sim.runs[: int(diag[DIAG_RUNS])],
            step_start_us=sim.steps_rec[:steps, 0],
            step_us=sim.steps_rec[:steps, 1],
            kv_blocks_used=sim.steps_rec[:steps, 2],
            running=sim.steps_rec[:steps, 3],
            totals=sim.totals_rec[:steps],
        )
    which = {1: "queueing_time", 2: "output_token_time", 3: "post_decode_time"}.get(
        int(diag[DIAG_FUNCTION]), "step_time"
    )
    return ReplayResult(
        int(status),
        int(steps),
        int(clock),
        sim.ttft,
        sim.e2e,
        sim.state,
        sim.preempts,
        trajectory,
        float(diag[DIAG_VALUE]),
        which,
        int(diag[DIAG_CACHED]),
        int(diag[DIAG_ADMITTED]),
        int(diag[DIAG_STRETCH]),
        float(diag[DIAG_FLOOR]),
        tuple(int(diag[i]) for i in (DIAG_TOK_PF, DIAG_N_PF, DIAG_N_DC, DIAG_CTX_MAX)),
    )
