"""What every replaying command starts from (`EvaluationSetup`: which experiments and how they are
read, how and where they are replayed, the loss), and the plain callables a command reports through:
`say` for a line to the user, a progress opener for a live display (the command line passes rich
ones; a library caller passes its own, or nothing)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.evaluator.datasets import OUTPUT_LEN_POLICIES, LoadedData, load_data
from stepml_evolve.evaluator.engine import Engine
from stepml_evolve.evaluator.executor import Cluster
from stepml_evolve.evaluator.fitting import ProgressFn
from stepml_evolve.evaluator.objectives import DEFAULT, Objective, load_objective
from stepml_evolve.evaluator.prompt_reuse import DEFAULT_POLICY
from stepml_evolve.evaluator.replay import DEFAULT_SEMANTICS

Say = Callable[[str], None]  # one line to the user
FitProgress = Callable[[], AbstractContextManager[ProgressFn]]  # opens a fit's display; yields what the fit reports to
SKIPPED = "skipped: "  # how a line about an input left out begins (the command line shows the word in yellow)


def quiet(message: str) -> None:
    """A `say` that tells no one."""


def no_progress(*_) -> AbstractContextManager[Callable[..., None]]:
    """A progress opener without a display."""
    return nullcontext(lambda *_: None)


@dataclass(frozen=True)
class EvaluationSetup:
    """The options every replaying command shares: the data (None: the built-in synthetic sample)
    and how it is read (output length, prompt reuse), the replay's semantics, the objective (with
    an optional weights file), and where replays run (threads, or a Ray cluster)."""

    data: Path | None = None
    output_len: str = OUTPUT_LEN_POLICIES[0]
    prompt_reuse: str = DEFAULT_POLICY
    semantics: str = DEFAULT_SEMANTICS
    objective: str = DEFAULT.name
    weights: Path | None = None
    workers: int | None = None
    cluster: Cluster | None = None

    def load(self, say: Say = quiet) -> LoadedData:
        """The good experiments of the data, each one skipped said, and a note when it is the
        synthetic sample; a DataError if none is good."""
        loaded = load_data(self.data, output_len=self.output_len, prompt_reuse=self.prompt_reuse)
        for e in loaded.errors:
            say(f"{SKIPPED}{e}")
        loaded.require_experiments()
        if loaded.synthetic:
            say(f"using the built-in synthetic sample: {loaded.label} (pass --data DIR for real experiments)")
        return loaded

    def goal(self, loaded: LoadedData) -> Objective:
        """The objective, its weights read (a pattern matching none of `loaded`'s experiments is refused)."""
        return load_objective(self.objective, self.weights, [e.name for e in loaded.experiments])

    def engine(self, loaded: LoadedData) -> Engine:
        """An engine replaying `loaded`'s experiments with these semantics, on threads or the cluster."""
        return Engine(loaded.experiments, self.workers, semantics=self.semantics, cluster=self.cluster)
