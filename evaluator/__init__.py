"""Evaluator: experiments, analytical components, the program DSL, replay simulation,
scoring and CMA-ES fitting. Knows nothing of the search.

What callers use, by job (each name is imported from its module on first use, so that
`import stepml_evolve.evaluator.errors` stays free of numba):
  data        load_data, LoadedData, DataError, Experiment, SPLITS (datasets.py, experiments.py)
  programs    parse_program, load_program, Program, ProgramError (dsl/)
  scoring     Engine (parallel closed-loop replays), MetricRow, Objective, load_objective
  fitting     fit, FitConfig, FitResult (fitting.py); cross_validate, make_folds (crossval.py)
  errors      UserError, the base of every error a user can cause
"""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".datasets": ("load_data", "LoadedData", "DataError"),
        ".experiments": ("Experiment", "SPLITS"),
        ".dsl": ("parse_program", "load_program", "Program", "ProgramError"),
        ".engine": ("Engine",),
        ".metrics": ("MetricRow",),
        ".objectives": ("Objective", "load_objective"),
        ".fitting": ("fit", "FitConfig", "FitResult"),
        ".crossval": ("cross_validate", "make_folds", "CrossValidation"),
        ".errors": ("UserError",),
    },
)
