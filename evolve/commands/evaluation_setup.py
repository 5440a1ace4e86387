"""What every replaying command starts from (`EvaluationSetup`: which experiments and how they are
read, how and where they are replayed, the loss), and the plain callables a command reports through:
`say` for a line to the user, a progress opener for a live display (the command line passes rich
ones; a library caller passes its own, or nothing)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stepml_evolve.evaluator.choices import DEFAULT_SEMANTICS, SEMANTICS
from stepml_evolve.evaluator.data.prompt_reuse import DEFAULT_POLICY
from stepml_evolve.evaluator.data.prompt_reuse import POLICIES as PROMPT_REUSE_POLICIES
from stepml_evolve.evaluator.datasets import OUTPUT_LEN_POLICIES, LoadedData, load_data
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fit.config import ProgressFn
from stepml_evolve.evaluator.say import SKIPPED, Say, quiet
from stepml_evolve.evaluator.scoring.objectives import DEFAULT, OBJECTIVES, Objective, load_objective
from stepml_evolve.evolve.option_fields import setting
from stepml_evolve.evolve.search.settings import OBJECTIVE_HELP, PROMPT_REUSE_HELP, SEMANTICS_HELP

# the replay's (numba): imported where replays start, so that the setup's fields (the command line's
# options) load none of it
if TYPE_CHECKING:
    from stepml_evolve.evaluator.replay.executor import Cluster
    from stepml_evolve.evaluator.scoring.pool import ReplayPool

FitProgress = Callable[[], AbstractContextManager[ProgressFn]]  # opens a fit's display; yields what the fit reports to


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (the command line's handler, `evolve.cli.main`): a
    command ends on it as on Ctrl-C, through the same cleanup, and says what it kept."""

    def __init__(self, signum: int, name: str = "SIGTERM"):
        super().__init__(name)
        self.signum, self.name = signum, name


class BadExperiments(UserError):
    """Experiments that do not load, without --skip-bad: one line each (its details), then this."""

    def __init__(self, loaded: LoadedData):
        self.details = tuple(str(e) for e in loaded.errors)
        n_bad, n_all = len(loaded.errors), len(loaded.errors) + len(loaded.experiments)
        super().__init__(
            f"{loaded.label}: {n_bad} of {n_all} experiments do not load (above); fix them, or pass "
            "--skip-bad to leave them out"
        )


def no_progress(*_) -> AbstractContextManager[Callable[..., None]]:
    """A progress opener without a display."""
    return nullcontext(lambda *_: None)


@dataclass(frozen=True)
class EvaluationSetup:
    """The options every replaying command shares: the data (None: the built-in synthetic sample)
    and how it is read (output length, prompt reuse), the replay's semantics, the objective (with
    an optional weights file), where replays run (threads, or a Ray cluster), and whether bad
    experiments are left out (skip_bad) or refused."""

    data: Path | None = setting(None, "Directory of replay experiments (default: the built-in synthetic sample).")
    output_len: str = setting(
        OUTPUT_LEN_POLICIES[0],
        "Output length policy: profile (server output_len) or reported (client token counts).",
        choices=OUTPUT_LEN_POLICIES,
    )
    prompt_reuse: str = setting(DEFAULT_POLICY, PROMPT_REUSE_HELP, choices=PROMPT_REUSE_POLICIES)
    semantics: str = setting(DEFAULT_SEMANTICS, SEMANTICS_HELP, choices=SEMANTICS)
    objective: str = setting(DEFAULT.name, OBJECTIVE_HELP, choices=OBJECTIVES)
    weights: Path | None = setting(
        None,
        "YAML file of experiment-name pattern -> weight (first match wins, others weigh 1), e.g. '\"*mixtral*\": 2'.",
    )
    workers: int | None = setting(None, "Parallel replay threads (default: all cores).", min=1)
    cluster: Cluster | None = None  # from --cluster and --remote-workers (evolve/cli/options.py)
    skip_bad: bool = setting(
        False,
        "Leave out the experiments that do not load (each said in a 'skipped:' line) instead of exiting 2: "
        "eval scores the good ones first, fit, cv and run stop before any work.",
    )

    def load(self, say: Say = quiet, keep_bad: bool = False) -> LoadedData:
        """The experiments of the data, and a note when it is the synthetic sample; a DataError if
        none is good. Bad experiments: with skip_bad each is said as skipped; else BadExperiments,
        before any work, unless `keep_bad` (the caller reports the good ones first, then calls
        `refuse_bad`)."""
        loaded = load_data(self.data, output_len=self.output_len, prompt_reuse=self.prompt_reuse)
        if self.skip_bad:
            for e in loaded.errors:
                say(f"{SKIPPED}{e}")
        elif not keep_bad or not loaded.experiments:
            self.refuse_bad(loaded)
        loaded.require_experiments()
        if loaded.synthetic:
            say(f"using the built-in synthetic sample: {loaded.label} (pass --data DIR for real experiments)")
        return loaded

    def refuse_bad(self, loaded: LoadedData) -> None:
        """BadExperiments if some experiment of `loaded` did not load and skip_bad is not set."""
        if loaded.errors and not self.skip_bad:
            raise BadExperiments(loaded)

    def goal(self, loaded: LoadedData) -> Objective:
        """The objective, its weights read (a pattern matching none of `loaded`'s experiments is refused)."""
        return load_objective(self.objective, self.weights, [e.name for e in loaded.experiments])

    def replay_pool(self, loaded: LoadedData, floor: bool = False) -> ReplayPool:
        """A pool replaying `loaded`'s experiments with these semantics, on threads or the cluster;
        floor: a replay fails at a step below its physical floor (--physics check)."""
        from stepml_evolve.evaluator.scoring.pool import ReplayPool

        return ReplayPool(loaded.experiments, self.workers, semantics=self.semantics, cluster=self.cluster, floor=floor)
