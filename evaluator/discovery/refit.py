"""The parent's own constants beside a candidate term, so a screening judges a term by its best fit.

A parent's constants were fitted without the term, and the fit soaks up what it can of a missing
mechanism: a prompt's cost before scheduling moves into the queueing constant, a tile's padding
into the compute efficiency. At those constants a term shows only what the fit left over. The
child's fit refits them with the term, so the screening lets them move too, linearized on the
frozen schedule: beside each term it fits a column per constant step_time reads (what a relative
change of the constant moves each request's E2E and TTFT by, a forward difference of the step
times summed over the request's steps) and, where the parent has a queueing time, a constant
delay per request. Constants read only by queueing_time or output_token_time other than that are
left out: their columns need each request's last step, which residuals do not keep.
"""

from __future__ import annotations

import numpy as np

from stepml_evolve.evaluator.dsl import Program
from stepml_evolve.evaluator.dsl.numexpr_compile import step_times

from .residuals import RequestResiduals

STEP = 1e-3  # the relative change of a constant its column is the difference quotient of (absolute where it is 0)


def refit_columns(program: Program, constants: dict[str, float], residuals: list[RequestResiduals]) -> list[np.ndarray]:
    """Per experiment of `residuals` (2, n, P): what each of the parent's constants moves its requests'
    E2E and TTFT by, per relative change (relative to the split's observed mean, as the residuals),
    the constants no step reads left out, and a last column of a constant delay where the program
    has a queueing time."""
    base = np.array([constants[k] for k in program.constants], dtype=np.float64)
    deltas = np.where(base != 0, STEP * np.abs(base), STEP)
    per_step = []
    for r in residuals:
        at = step_times(program, r.components, base)
        columns = []
        for j, d in enumerate(deltas):
            moved = base.copy()
            moved[j] += d
            columns.append((step_times(program, r.components, moved) - at) / STEP)
        per_step.append(np.stack(columns, axis=1) if columns else np.zeros((r.n_steps, 0)))
    read = [j for j in range(len(base)) if any(np.any(g[:, j] != 0) for g in per_step)]
    delay = "queueing_time" in program.functions
    out = []
    for r, g in zip(residuals, per_step):
        sums = r.sums(g[:, read]) if read else np.zeros((2, r.n, 0))
        out.append(np.concatenate([sums, r.delays(np.ones(r.n))], axis=2) if delay else sums)
    return out
