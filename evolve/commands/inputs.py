"""The experiments a replaying command works on, with a note on each one skipped and on the
synthetic sample standing in for real data."""
from __future__ import annotations

from pathlib import Path

from stepml_evolve.evaluator.datasets import LoadedData, load_data
from stepml_evolve.evaluator.prompt_reuse import DEFAULT_POLICY

from stepml_evolve.evolve.cli.console import Log


def load_usable(data: Path | None, output_len: str, log: Log, prompt_reuse: str = DEFAULT_POLICY) -> LoadedData:
    """The good experiments of `data` (the synthetic sample when None); a DataError if there is none."""
    loaded = load_data(data, output_len=output_len, prompt_reuse=prompt_reuse)
    for e in loaded.errors:
        log.skipped(str(e))
    loaded.require_experiments()
    if loaded.synthetic:
        log.note(f"using the built-in synthetic sample: {loaded.label} (pass --data DIR for real experiments)")
    return loaded
