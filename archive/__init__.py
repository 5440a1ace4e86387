"""The search archive: SQLite store (store.py) of typed records (records.py), the MAP-Elites grid
and Pareto front with the add-status query (map_elites.py), read-only browsing (browse.py) and the HTML
report (report.py). This package stores what `evaluator` measured; it knows nothing of how
programs are made."""

from .browse import BrowseError
from .map_elites import AddStatus, Elites, best, cell_of, elites, pareto_front
from .records import (
    CVEvaluationRecord,
    CVScoreRecord,
    EvaluationRecord,
    GenerationRecord,
    LLMCallRecord,
    NewProgram,
    ProgramRecord,
    RejectionRecord,
    RunRecord,
)
from .store import SCHEMA_VERSION, Archive, ArchiveError

__all__ = [
    "AddStatus",
    "Elites",
    "best",
    "cell_of",
    "elites",
    "pareto_front",
    "CVEvaluationRecord",
    "CVScoreRecord",
    "EvaluationRecord",
    "GenerationRecord",
    "LLMCallRecord",
    "NewProgram",
    "ProgramRecord",
    "RejectionRecord",
    "RunRecord",
    "SCHEMA_VERSION",
    "Archive",
    "ArchiveError",
    "BrowseError",
]
