"""The library function behind each command (named after its verb), and what they share: the
`EvaluationSetup` a replaying command starts from and `say`, the plain callable they report through.
They know nothing of the terminal; `evolve.cli` parses, calls one of them and prints."""

from ..go.emission import emit_program
from .archive_cv import DEFAULT_PROTOCOL, cross_validate_archive, migrate_archive
from .bench import run_bench
from .bench_cluster import cluster_bench
from .cv import cross_validate_program
from .eval import evaluate_program
from .evaluation_setup import SKIPPED, EvaluationSetup, Say, Terminated
from .fit import fit_program
from .report import write_report
from .run import ENGINES, LLMSettings, engine_rule, run_search

__all__ = [
    "DEFAULT_PROTOCOL",
    "ENGINES",
    "SKIPPED",
    "EvaluationSetup",
    "LLMSettings",
    "Say",
    "Terminated",
    "cluster_bench",
    "cross_validate_archive",
    "cross_validate_program",
    "emit_program",
    "engine_rule",
    "evaluate_program",
    "fit_program",
    "migrate_archive",
    "run_bench",
    "run_search",
    "write_report",
]
