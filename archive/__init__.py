"""The search archive, storage only: SQLite store (store.py) of typed records (records.py), the
MAP-Elites grid and Pareto front with the add-status query (map_elites.py), and read-only access
(access.py: locating, opening, resolving a program). This package stores what `evaluator`
measured; it knows nothing of how programs are made, browsed (evolve/browse/) or chosen for
deployment (evolve/deploy/).

What callers use (imported on first use: importing one module of this package, such as
choices.py, never loads the others)."""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".map_elites": ("AddStatus", "Elites", "best", "cell_of", "elites", "pareto_front"),
        ".records": (
            "CVEvaluationRecord",
            "CVScoreRecord",
            "EvaluationRecord",
            "GenerationRecord",
            "LLMCallRecord",
            "NewProgram",
            "ProgramRecord",
            "RejectionRecord",
            "RunRecord",
        ),
        ".store": ("SCHEMA_VERSION", "Archive", "ArchiveError"),
        ".access": ("BrowseError",),
    },
)
