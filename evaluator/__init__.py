"""Evaluator: experiments, analytical components, the program DSL, replay simulation,
scoring and CMA-ES fitting. Knows nothing of the search.

What callers use, by job (each name is imported from its module on first use, so that
`import stepml_evolve.evaluator.errors` stays free of numba):
  data        load_data, LoadedData, DataError (datasets.py); Experiment, SPLITS (data/)
  programs    parse_program, load_program, Program, ProgramError (dsl/)
  scoring     ReplayPool (parallel closed-loop replays), MetricRow, Objective, load_objective (scoring/)
  fitting     fit, FitConfig, FitResult (fit/fitting.py); cross_validate, make_folds (fit/crossval.py)
  errors      UserError, the base of every error a user can cause
"""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".datasets": ("load_data", "LoadedData", "DataError"),
        ".data.experiments": ("Experiment", "SPLITS"),
        ".dsl": ("parse_program", "load_program", "Program", "ProgramError"),
        ".scoring.pool": ("ReplayPool",),
        ".scoring.metrics": ("MetricRow",),
        ".scoring.objectives": ("Objective", "load_objective"),
        ".fit.fitting": ("fit_constants", "FitConfig", "FitResult"),
        ".fit.crossval": ("cross_validate", "make_folds", "CrossValidation"),
        ".errors": ("UserError",),
    },
)
