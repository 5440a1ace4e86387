"""The search: the loop (loop.py), the evaluation cascade it runs each child through (cascade.py),
its settings and the checks a resume makes (settings.py); the emitters that propose children
(emitters.py: symbolic.py, and llm_operator.py over llm_client.py) and parent selection
(selection.py) are imported from their modules.

What callers use is imported on first use: the settings (settings.py) never load the loop."""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".cascade": ("Judgement", "structure_hash"),
        ".loop": ("PATIENCE_GAIN", "Search"),
        ".settings": (
            "CV_MODES",
            "ENGINES",
            "FRONT_CV_MODES",
            "LEGACY_SETTINGS",
            "TIME_COMPONENT_MODES",
            "UNEXERCISED_MODES",
            "UNITS_MODES",
            "LLMSettings",
            "RunSettings",
            "SearchConfig",
            "SearchError",
            "check_engine_resumable",
            "check_seed_units",
        ),
    },
)
