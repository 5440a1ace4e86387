"""Discovery: where a fitted program is wrong, and which terms would fix it.

residuals.py: per-request residuals on the program's recorded schedule, and the per-request sums of
any per-step column (what a term added to step_time would move); explain.py: where the error grows
(by context, chunk, batch, decode share, model, TP, workload); terms.py: the typed library of
candidate terms, each a valid time under --physics check by construction; screening.py: each
candidate's gain in closed form on the frozen schedule, guarded by held-out groups.
"""
