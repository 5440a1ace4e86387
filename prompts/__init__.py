"""The LLM's prompts, jinja2 templates read as package data (never imported): system.j2 (the DSL,
the components and the rules a program must keep), mutate.j2 (a parent, its errors and other
programs, asking for a child) and retry.j2 (a rejected reply and why). They are rendered by
`stepml_evolve.evolve.search.llm_operator.prompt_templates()`, for our LLM operator and for
OpenEvolve's system message; this package offers no names."""

__all__: list[str] = []
