"""Evaluator: experiments, analytical components, the program DSL, replay simulation,
scoring and CMA-ES fitting. Knows nothing of the search."""
