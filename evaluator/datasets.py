"""Where experiments come from: a directory given by the user, or the built-in synthetic sample
(generated once into the cache directory; label says "synthetic"). Also what `evolve data`
reports about them (`DataCheck`) and writes (`write_synthetic_sample`)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from stepml_evolve.evaluator.data.experiment_reader import experiment_dirs, load_experiments
from stepml_evolve.evaluator.data.experiments import Experiment, ExperimentError, LoadOptions
from stepml_evolve.evaluator.data.prompt_reuse import DEFAULT_POLICY
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.outputs import check_output_dir, directory_written_whole

SYNTHETIC_SEED = 0
OUTPUT_LEN_POLICIES = ("profile", "reported")  # see LoadOptions.output_len


class DataError(UserError):
    """No usable experiments where the user pointed (or a bad loading option): one line naming it."""


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

    def require_experiments(self) -> LoadedData:
        """Itself, if at least one experiment loaded."""
        if not self.experiments:
            raise DataError(f"{self.label}: no valid experiments")
        return self


@dataclass(frozen=True)
class ExperimentSummary:
    """One row of `evolve data check`."""

    name: str
    model: str
    tp: int
    moe: bool
    hardware: str
    n_requests: int
    n_failed: int
    output_len: int | str  # the profile's output length, or "reported"
    observed: dict[str, float]
    split: dict[str, int]
    synthetic: bool
    notes: list[str]
    measurement: str = "client"  # where TTFT/E2E were measured (and the replay's arrival): client or server
    prompt_reuse: dict | None = None  # what the loader decided about shared prompts (prompt_reuse.ReuseReport)

    @classmethod
    def of(cls, e: Experiment) -> ExperimentSummary:
        return cls(
            name=e.name,
            model=e.model,
            tp=e.tp,
            moe=e.arch.moe,
            hardware=e.hardware.name,
            n_requests=e.n_requests,
            n_failed=e.n_failed,
            output_len=e.output_len_used if e.output_len_used is not None else "reported",
            observed=e.observed_means(),
            split=e.split_sizes(),
            synthetic=e.synthetic,
            notes=e.notes,
            measurement=e.measurement,
            prompt_reuse=e.prompt_reuse.to_json() if e.prompt_reuse else None,
        )

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DataCheck:
    """What `evolve data check` reports: a summary per good experiment, the error of each bad one."""

    label: str
    synthetic: bool
    experiments: list[ExperimentSummary]
    errors: list[ExperimentError]

    def to_json(self) -> dict:
        return {
            "data": self.label,
            "synthetic": self.synthetic,
            "experiments": [e.to_json() for e in self.experiments],
            "errors": [{"name": e.experiment, "error": e.problem} for e in self.errors],
        }


def check_data(
    data: str | Path | None = None, output_len: str = "profile", prompt_reuse: str = DEFAULT_POLICY
) -> DataCheck:
    loaded = load_data(data, output_len=output_len, prompt_reuse=prompt_reuse)
    return DataCheck(
        loaded.label, loaded.synthetic, [ExperimentSummary.of(e) for e in loaded.experiments], loaded.errors
    )


def cache_dir() -> Path:
    return Path(os.environ.get("STEPML_CACHE", Path.home() / ".cache" / "stepml-evolve"))


def sample_size() -> str:
    """STEPML_SAMPLE_SIZE picks the built-in sample: full (the default) or small (the same four
    scenarios in a fifth of the requests: quick demos and the test suite)."""
    from stepml_evolve.evaluator.known_truth.synthetic_sample import SAMPLE_SIZES

    size = os.environ.get("STEPML_SAMPLE_SIZE", "full")
    if size not in SAMPLE_SIZES:
        raise DataError(f"STEPML_SAMPLE_SIZE={size!r}: use one of {', '.join(SAMPLE_SIZES)}")
    return size


def synthetic_dir(size: str | None = None) -> Path:
    """The synthetic sample on disk, generated on first use (atomically, safe for parallel runs);
    its size is the built-in sample's (STEPML_SAMPLE_SIZE) unless given."""
    from stepml_evolve.evaluator.known_truth.synthetic_sample import GENERATOR_VERSION, write_sample

    size = size or sample_size()
    target = cache_dir() / f"synthetic-v{GENERATOR_VERSION}-seed{SYNTHETIC_SEED}{'' if size == 'full' else '-' + size}"
    if (target / ".complete").exists():
        return target
    tmp = None
    try:  # whole or not at all: a failed write (a full disk) leaves no temporary directory behind
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".synthetic-", dir=target.parent))
        write_sample(tmp, seed=SYNTHETIC_SEED, size=size)
        (tmp / ".complete").write_text("ok\n")
        try:
            tmp.rename(target)
        except OSError:
            if not (target / ".complete").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise DataError(
                f"{target}: cannot write the built-in synthetic sample into the cache ({e.strerror or e}): "
                "nothing written (free space there, or point STEPML_CACHE at another directory)"
            ) from None
        raise
    return target


def load_data(
    data: str | Path | None = None,
    output_len: str = "profile",
    split: tuple[float, float] = (0.6, 0.2),
    prompt_reuse: str = DEFAULT_POLICY,
) -> LoadedData:
    """Load experiments from `data`, or the synthetic sample when `data` is None. The bad ones are
    in `errors`; a directory without any experiment is a DataError."""
    try:
        options = LoadOptions(output_len=output_len, split=split, prompt_reuse=prompt_reuse)
    except ValueError as e:
        raise DataError(str(e)) from None
    if data is None:
        directory = synthetic_dir()
        good, bad = load_experiments(directory, options)
        return LoadedData(f"synthetic sample ({directory})", True, directory, good, bad)
    directory = Path(data)
    try:
        good, bad = load_experiments(directory, options)
    except FileNotFoundError as e:  # no such directory
        raise DataError(str(e)) from None
    if not good and not bad:
        raise DataError(f"{directory}: no experiment directories found")
    return LoadedData(str(directory), False, directory, good, bad)


def write_synthetic_sample(out_dir: Path, seed: int = SYNTHETIC_SEED, size: str | None = None) -> list[Path]:
    """The synthetic sample (hidden oracle + noise) written into a new or empty directory, whole or
    not at all; its size is the built-in sample's (STEPML_SAMPLE_SIZE) unless given."""
    from stepml_evolve.evaluator.known_truth.synthetic_sample import write_sample

    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    with directory_written_whole(out_dir) as tmp:  # a full disk half-way leaves nothing, and a rerun is not refused
        written = write_sample(tmp, seed=seed, size=size or sample_size())
    return [out_dir / d.name for d in written]
