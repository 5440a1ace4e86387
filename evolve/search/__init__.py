"""The search: the loop (loop.py), the evaluation cascade it runs each child through (cascade.py),
its settings and the checks a resume makes (settings.py); the emitters that propose children
(emitters.py: symbolic.py, and llm_operator.py over llm_client.py) and parent selection
(selection.py) are imported from their modules."""

from .cascade import Judgement, structure_hash
from .loop import PATIENCE_GAIN, Search
from .settings import (
    CV_MODES,
    FRONT_CV_MODES,
    LEGACY_SETTINGS,
    TIME_COMPONENT_MODES,
    UNEXERCISED_MODES,
    UNITS_MODES,
    RunSettings,
    SearchConfig,
    SearchError,
    check_engine_resumable,
    check_seed_units,
)

__all__ = [
    "CV_MODES",
    "FRONT_CV_MODES",
    "LEGACY_SETTINGS",
    "PATIENCE_GAIN",
    "TIME_COMPONENT_MODES",
    "UNEXERCISED_MODES",
    "UNITS_MODES",
    "Judgement",
    "RunSettings",
    "Search",
    "SearchConfig",
    "SearchError",
    "check_engine_resumable",
    "check_seed_units",
    "structure_hash",
]
