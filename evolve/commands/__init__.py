"""The library function behind each command (named after its verb), and what they share: the
`EvaluationSetup` a replaying command starts from and `say`, the plain callable they report through.
They know nothing of the terminal; `evolve.cli` parses, calls one of them and prints.

Each name is imported on first use: the command line builds its options from evaluation_setup.py
and loads a command's backend only when that command runs."""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        "..go.emission": ("emit_program",),
        ".archive_cv": ("cross_validate_archive", "migrate_archive"),
        ".bench": ("run_bench",),
        ".bench_cluster": ("cluster_bench",),
        ".cv": ("cross_validate_program",),
        ".eval": ("evaluate_program",),
        ".evaluation_setup": ("EvaluationSetup", "Terminated"),
        "stepml_evolve.evaluator.say": ("SKIPPED", "Say"),
        ".fit": ("fit_program",),
        ".report": ("write_report",),
        ".run": ("engine_rule", "run_search"),
        "..search.settings": ("ENGINES", "LLMSettings"),
        "stepml_evolve.evaluator.choices": ("DEFAULT_PROTOCOL",),
    },
)
