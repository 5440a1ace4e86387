"""stepml-evolve: discovers step-time prediction programs for LLM-inference simulators.

The installed name over the repository's folders: `stepml_evolve.evaluator` (data, components, the
program DSL, replay, fitting), `stepml_evolve.archive` (the SQLite archive), `stepml_evolve.evolve`
(the search, the commands, Go and BLIS), `stepml_evolve.seeds` and `stepml_evolve.prompts`.
"""
