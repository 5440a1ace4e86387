"""What people read from a search archive: the rows, details, diffs and history behind
`evolve archive list/pareto/show/diff/history` (listing.py) and the HTML report (html_report.py, from
templates/). It reads the archive through archive.access and ranks CV scores as evolve/deploy
does, so `list --sort cv` and the report agree with what emit-go deploys.

What callers use (imported on first use: choices.py, the sort keys, loads nothing)."""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".choices": ("SORT_KEYS",),
        ".listing": (
            "list_programs",
            "front_programs",
            "show_program",
            "show_source",
            "compare_programs",
            "run_history",
        ),
        ".html_report": ("render",),
    },
)
