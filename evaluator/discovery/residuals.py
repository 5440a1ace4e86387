"""Per-request residuals of a program at its constants, and the sums that move them.

On a recorded schedule (the closed loop replayed at the program's constants), every measured
request's TTFT and E2E are sums of the steps it lives through (scoring/surrogate.py `Lifetimes`):
the share of the step in flight when it became ready, the steps to its first token, then (E2E)
the steps of its runs that gave it a later token. So adding a term g(step) to step_time moves
each request's latencies by the sum of g over its own steps, and a term g(request) added to
queueing_time by g itself (`RequestResiduals.delays`): `RequestResiduals.sums(G)` gives those
sums for K candidate columns at once (prefix sums over the steps, O(steps * K)), which is what
makes screening thousands of terms a matter of seconds (screening.py) and what `explain.py` reads to
say where, inside an experiment, the error grows. The schedule is frozen: batching, preemption and
time-outs do not move with the term, which is why every proposal is judged by the closed loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numba import njit

from stepml_evolve.evaluator.data.experiments import Experiment
from stepml_evolve.evaluator.dsl import Program, compile_program, parse_program
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.hardware.components import COMPONENT_INDEX, component_values
from stepml_evolve.evaluator.replay.closed_loop import experiment_coefficients
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evaluator.scoring.surrogate import VectorProgram, lifetimes, recorded_replay

E2E, TTFT = 0, 1  # the rows of the two latencies everywhere below


class ResidualsError(UserError):
    """Residuals that cannot be computed (no data, a replay that fails): one line naming the program."""


@dataclass
class RequestResiduals:
    """One experiment's measured requests on the program's recorded schedule: n requests whose
    first token came before the client's limit (their TTFT moves with the steps), of which those
    with `finished` also have an E2E that does."""

    name: str
    model: str
    tp: int
    workload: str
    components: np.ndarray  # (N_COMPONENTS, S) each step's components
    observed: np.ndarray  # (2, n) E2E, TTFT in us
    predicted: np.ndarray  # (2, n) the closed loop's, in us
    finished: np.ndarray  # (n,) bool: the E2E is measured and moves with the steps
    input_tokens: np.ndarray  # (n,)
    output_tokens: np.ndarray  # (n,)
    after: np.ndarray  # (n,) first whole step of the TTFT
    first: np.ndarray  # (n,) the step of the first token
    in_flight: np.ndarray  # (n,) the step in flight when the request became ready (-1: none)
    left: np.ndarray  # (n,) the share of it left then
    runs: sp.csr_matrix  # (n, k) which request each decode run (after the first token) belongs to
    run_a: np.ndarray  # (k,) its first step
    run_b: np.ndarray  # (k,) its last step
    scale: np.ndarray  # (2,) the split's observed mean E2E and TTFT (us): residuals relative to it

    @property
    def n(self) -> int:
        return len(self.after)

    @property
    def n_steps(self) -> int:
        return self.components.shape[1]

    @property
    def residual(self) -> np.ndarray:
        """(2, n) observed - predicted, relative to the split's observed mean (0 where not measured)."""
        r = (self.observed - self.predicted) / self.scale[:, None]
        r[E2E, ~self.finished] = 0.0
        return r

    def column(self, name: str) -> np.ndarray:
        """A component's value at every step."""
        return self.components[COMPONENT_INDEX[name]]

    def sums(self, per_step: np.ndarray) -> np.ndarray:
        """(2, n, K): for K per-step columns (S, K) (or one, (S,)), each request's sum over the steps
        of its E2E and of its TTFT, relative to the split's observed mean (0 where not measured)."""
        g = np.asarray(per_step, dtype=np.float64).reshape(self.n_steps, -1)
        c = prefix_sums(g)
        ttft = c[np.maximum(self.first + 1, self.after)] - c[self.after]
        held = self.in_flight >= 0
        ttft[held] += self.left[held, None] * g[self.in_flight[held]]
        decode = self.runs @ (c[self.run_b + 1] - c[self.run_a]) if self.run_a.size else np.zeros_like(ttft)
        e2e = np.where(self.finished[:, None], ttft + decode, 0.0)
        return np.stack([e2e / self.scale[E2E], ttft / self.scale[TTFT]])

    def delays(self, per_request: np.ndarray) -> np.ndarray:
        """(2, n, K): for K per-request columns (n, K) of a delay before the request is scheduled
        (queueing_time), what each adds to its E2E and its TTFT: itself, on the frozen schedule,
        relative to the split's observed mean (0 where not measured)."""
        d = np.asarray(per_request, dtype=np.float64).reshape(self.n, -1)
        e2e = np.where(self.finished[:, None], d, 0.0)
        return np.stack([e2e / self.scale[E2E], d / self.scale[TTFT]])


def prefix_sums(g: np.ndarray) -> np.ndarray:
    """(S + 1, K): row i holds the sum of the first i rows of g (S, K), each column summed in row
    order, bit for bit what np.cumsum(g, axis=0) gives, in a compiled loop: numpy's cumsum along
    the first axis was a third of the screening's time on the real data (docs/results/index.md,
    "screening")."""
    g = np.ascontiguousarray(g, dtype=np.float64)
    c = np.empty((g.shape[0] + 1, g.shape[1]))
    _prefix_sums(g, c)
    return c


@njit(cache=True, nogil=True)
def _prefix_sums(g, c):
    rows, cols = g.shape
    for k in range(cols):
        c[0, k] = 0.0
    for i in range(rows):
        for k in range(cols):
            c[i + 1, k] = c[i, k] + g[i, k]


def record_residuals(
    exp: Experiment,
    source: str,
    constants: np.ndarray,
    split: str = "train",
    semantics: str = "blis",
    floor: bool = False,
) -> RequestResiduals | str:
    """`exp`'s requests of `split` on the schedule the program `source` at `constants` gives; a
    one-line reason where the replay fails or no request of the split is measured. (Program text,
    not a Program: the pool may replay on a Ray cluster.)"""
    program = parse_program(source)
    compiled, vector = compile_program(program), VectorProgram.of(program)
    res = recorded_replay(exp, compiled, constants, split, semantics, floor)
    if not res.ok:
        return f"{exp.name}: {res.failure()}"
    t = res.trajectory
    ok = exp.split_mask(split) & ~exp.failed
    if not ok.any() or t.n_steps == 0:
        return f"{exp.name}: no request of the {split} split is measured"
    comps = np.array(component_values(*t.totals.T, experiment_coefficients(exp)), dtype=np.float64)
    life = lifetimes(exp, res, vector, constants, ok, comps)
    measured = np.flatnonzero(life.timed)
    if not len(measured):
        return f"{exp.name}: no request of the {split} split got its first token before its client's limit"
    finished = life.finished[measured]
    position = np.full(exp.n_requests, -1, np.int64)
    position[measured] = np.arange(len(measured))
    runs = t.runs
    run_a = np.maximum(runs[:, 1], life.first[runs[:, 0]] + 1)
    keep = (position[runs[:, 0]] >= 0) & life.finished[runs[:, 0]] & (run_a <= runs[:, 2])
    pos = position[runs[keep, 0]]
    membership = sp.csr_matrix(
        (np.ones(len(pos)), (pos, np.arange(len(pos)))), shape=(len(measured), len(pos)), dtype=np.float64
    )
    observed = np.stack([exp.e2e_s[measured], exp.ttft_s[measured]]) * 1e6
    predicted = np.stack([res.e2e_us[measured], res.ttft_us[measured]]).astype(np.float64)
    scale = np.array(
        [observed[E2E, finished].mean() if finished.any() else 1.0, observed[TTFT].mean()], dtype=np.float64
    )
    return RequestResiduals(
        name=exp.name,
        model=exp.model,
        tp=exp.tp,
        workload=exp.workload,
        components=comps,
        observed=observed,
        predicted=predicted,
        finished=finished,
        input_tokens=exp.input_tokens[measured].astype(np.float64),
        output_tokens=exp.output_tokens[measured].astype(np.float64),
        after=life.after[measured],
        first=life.first[measured],
        in_flight=life.in_flight[measured],
        left=life.left[measured],
        runs=membership,
        run_a=run_a[keep],
        run_b=runs[keep, 2],
        scale=np.where(scale > 0, scale, 1.0),
    )


def residuals_of(
    program: Program,
    constants: dict[str, float],
    pool: ReplayPool,
    experiments: list[Experiment] | None = None,
    split: str = "train",
    origin: str = "",
) -> list[RequestResiduals]:
    """Every experiment's residuals (replayed on the pool's threads); ResidualsError, one line naming
    `origin` (the program), where there is no experiment or a replay fails."""
    exps = pool.experiments if experiments is None else experiments
    who = origin or "the program"
    if not exps:
        raise ResidualsError(f"{who}: no experiment to compute residuals on")
    vector = np.array([constants[k] for k in program.constants], dtype=np.float64)
    out = pool.executor.map(
        record_residuals, [(e, (program.source, vector, split, pool.semantics, pool.floor)) for e in exps]
    )
    failed = [r for r in out if isinstance(r, str)]
    if failed:
        raise ResidualsError(f"{who}: residuals cannot be computed: {failed[0]}")
    return out
