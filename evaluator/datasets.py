"""Where experiments come from: a directory given by the user, or the built-in synthetic sample
(generated once into the cache directory; label says "synthetic")."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .experiments import Experiment, ExperimentError, LoadOptions, experiment_dirs, load_experiments

SYNTHETIC_SEED = 0


@dataclass
class LoadedData:
    label: str  # the data directory, or "synthetic sample (...)"
    synthetic: bool
    directory: Path
    experiments: list[Experiment]
    errors: list[ExperimentError] = field(default_factory=list)

    def fingerprint(self) -> str:
        """Hash of the experiment files, so an archive can tell whether its data changed."""
        h = hashlib.sha256()
        for d in experiment_dirs(self.directory):
            for name in ("requests.json", "ground_truth.json", "profile.json"):
                p = d / name
                if p.is_file():
                    h.update(f"{d.name}/{name}:{p.stat().st_size}:".encode())
                    h.update(hashlib.sha256(p.read_bytes()).digest())
        return h.hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("STEPML_CACHE", Path.home() / ".cache" / "stepml-evolve"))


def synthetic_dir() -> Path:
    """The synthetic sample on disk, generated on first use (atomically, safe for parallel runs)."""
    from .synthetic import GENERATOR_VERSION, write_sample

    target = cache_dir() / f"synthetic-v{GENERATOR_VERSION}-seed{SYNTHETIC_SEED}"
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".synthetic-", dir=target.parent))
    write_sample(tmp, seed=SYNTHETIC_SEED)
    (tmp / ".complete").write_text("ok\n")
    try:
        tmp.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_data(data: str | Path | None = None, output_len: str = "profile",
              split: tuple[float, float] = (0.6, 0.2)) -> LoadedData:
    """Load experiments from `data`, or the synthetic sample when `data` is None."""
    options = LoadOptions(output_len=output_len, split=split)
    if data is None:
        directory = synthetic_dir()
        good, bad = load_experiments(directory, options)
        return LoadedData(f"synthetic sample ({directory})", True, directory, good, bad)
    directory = Path(data)
    good, bad = load_experiments(directory, options)
    if not good and not bad:
        raise FileNotFoundError(f"{directory}: no experiment directories found")
    return LoadedData(str(directory), False, directory, good, bad)
