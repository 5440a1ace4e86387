"""stepml-evolve: discovers step-time prediction programs for LLM-inference simulators.

The Python API (for notebooks; api/api.py in the repository): `open_archive(DIR)` gives an archive's
programs (the Pareto front marked), evaluations, CV scores and generations as pandas DataFrames
and a program's text; `score`, `fit` and `emit_go` do what `evolve eval`, `fit` and `emit-go` do
to a program file or text. Bad input raises `UserError` (one line), as the command line reports it.

The installed name over the repository's folders: `stepml_evolve.evaluator` (data, components, the
program DSL, replay, fitting), `stepml_evolve.archive` (the SQLite archive), `stepml_evolve.evolve`
(the search, the commands, Go and BLIS), `stepml_evolve.seeds` and `stepml_evolve.prompts`.
Names are imported on first use, so importing any module of the package stays light.
"""

from .lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".api": ("open_archive", "ArchiveView", "score", "fit", "Fitted", "emit_go"),
        ".evaluator.errors": ("UserError",),
    },
)
