"""OpenEvolve as the search engine (`evolve run --engine openevolve`): its controller over our
judge and archive (engine.py), the evaluator file OpenEvolve loads by path (judge_client.py, never
imported here), and the local HTTP server that is both its judge and its LLM endpoint
(local_server.py).

What callers use (imported on first use; OpenEvolve itself only when a run starts):
run_openevolve, require_openevolve (a one-line error when OpenEvolve is absent or of another
release line), OUTPUT_DIR (OpenEvolve's directory under the archive).
"""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".engine": ("run_openevolve", "require_openevolve", "OUTPUT_DIR"),
    },
)
