"""The `evolve` command line and what it drives: the search (search/), the library functions
behind the commands (commands/), Go emission (go/), BLIS installation and comparison (blis/) and
OpenEvolve as an engine (openevolve/).

What callers use (imported on first use: importing one module of this package never loads the
command line or the search):
  main                                   the `evolve` command (cli/)
  run_search, SearchConfig               `evolve run`
  evaluate_program, fit_program          `evolve eval`, `evolve fit`
  cross_validate_program                 `evolve cv`
  cross_validate_archive                 `evolve archive cv`
  emit_program, emitted_sources          `evolve emit-go` (to files, or as text)
  write_report                           `evolve archive report`
"""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".cli": ("main",),
        ".commands.run": ("run_search",),
        ".search.loop": ("SearchConfig",),
        ".commands.eval": ("evaluate_program",),
        ".commands.fit": ("fit_program",),
        ".commands.cv": ("cross_validate_program",),
        ".commands.archive_cv": ("cross_validate_archive",),
        ".go.emission": ("emit_program", "emitted_sources"),
        ".commands.report": ("write_report",),
    },
)
