"""A search's settings, and what a resume checks against them.

`SearchConfig` is what a search is given. `RunSettings` is the part that makes a run what it is,
as the archive stores it with the run and a resume must repeat: the search settings but those a
resumed run may change (`NOT_IDENTITY`), the LLM model and the custom seeds (by content). A
setting added after runs were first stored has a legacy value (`LEGACY_SETTINGS`): the value an
archive stored without it ran with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.archive.records import RunRecord
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.crossval import GROUPS, GROUPS_PREFIX, PROTOCOLS
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import ProgramError, check_units, parse_program
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fitting import METHODS
from stepml_evolve.evaluator.objectives import Objective
from stepml_evolve.evaluator.prompt_reuse import (
    DEFAULT_POLICY as DEFAULT_PROMPT_REUSE,
)
from stepml_evolve.evaluator.prompt_reuse import (
    LEGACY_POLICY as LEGACY_PROMPT_REUSE,
)
from stepml_evolve.evaluator.replay import DEFAULT_SEMANTICS
from stepml_evolve.evaluator.soundness import PHYSICS_MODES

CV_MODES = ("none", *PROTOCOLS)  # --cv: what a full fit's validation loss is (none: the validation windows)
# and groups:FILE, which a run stores as GROUPS with the file's folds (cv_groups)
FRONT_CV_MODES = (*PROTOCOLS, "none")  # --front-cv: how the Pareto front is cross-validated when a run ends
LINEAR_MODES = ("sample", "solve")  # --linear: how a fit's surrogate step finds the constants a program is affine in
UNITS_MODES = ("check", "off")  # check: seeds and children must be unit-consistent (evaluator/dsl/units.py)
# keep: a child must use every time component (f.gemm_pf ... f.allreduce) its first parent uses;
# the default since the worlds' benchmark (docs/HISTORY.md "Keeping every time component")
TIME_COMPONENT_MODES = ("keep", "free")
# reject: a child may not use a component the data never varies (f.allreduce when every experiment
# runs at tp 1, f.tp at one TP) more often than its first parent does (docs/HISTORY.md, "Terms the
# train configurations cannot judge")
UNEXERCISED_MODES = ("reject", "allow")


class SearchError(UserError, RuntimeError):
    """The search cannot go on; the message is one line."""


@dataclass(frozen=True)
class SearchConfig:
    generations: int = 500
    seed: int = 7
    children: int = 8  # per generation
    llm_ratio: float = 0.5  # share of children asked of the LLM (when one is configured)
    max_promotions: int = 2  # full fits per generation at most (they dominate a generation's time)
    promote_margin: float = 0.05  # promote when the quick loss is within 5% of the reference it must beat
    sanity_factor: float = 3.0  # never promote a quick loss above 3x the best screening loss
    quick_evals: int | None = (
        None  # screening fit budget per child (closed-loop evaluations; None: the method's default)
    )
    # the screening fit's surrogate evaluations per trust-region iteration (None: 200 + 40 n, the
    # default before; 80 made the same promotions in 15 of 17 generations of the real-data run for
    # a fifth less CPU: docs/HISTORY.md "Screening with 80 surrogate evaluations")
    quick_surrogate: int | None = 80
    full_fit_evals: int | None = 8  # closed-loop evaluations of a promoted child's fit (None: the method's default)
    full_fit_sigma: float = 0.2
    seed_fit_evals: int | None = None  # None: the standard fit budget
    # the trust region of a promoted child's full fit: closed-loop judged points per iteration,
    # and surrogate evaluations per iteration (None: 200 + 40 n); seed fits keep the standard
    # fit's. docs/HISTORY.md "Search speed" measured what these buy
    full_fit_candidates: int = 1
    full_fit_surrogate: int | None = 150
    # "solve": the screening and promoted fits' trust region solves the constants a program is
    # affine in by least squares (evaluator/linear_solve.py) and samples only the others; faster,
    # but the promoted fits ended worse on four seeds of five (docs/HISTORY.md), so "sample"
    # (CMA-ES samples them all) stays the default
    linear: str = LINEAR_MODES[0]
    islands: int = 1
    migration_interval: int = 25
    semantics: str = DEFAULT_SEMANTICS  # how the replay accounts a step: "blis" or "vllm"
    prompt_reuse: str = DEFAULT_PROMPT_REUSE  # which requests shared prompts (evaluator/prompt_reuse.py)
    fit_method: str = METHODS[0]
    objective: str = "rms"
    weights: tuple[tuple[str, float], ...] = ()  # (experiment-name pattern, weight); see evaluator/objectives.py
    patience: int | None = None  # stop after this many generations without a 0.5% gain in best validation loss
    units: str = UNITS_MODES[0]  # "check": reject a seed or child whose step time is not a time; "off"
    cv: str = CV_MODES[0]  # lomo/lowo: a full fit is the fold fits too, and its validation loss is the CV loss
    # closed-loop evaluations of each fold's fit, warm-started from the fit on every experiment
    # (0: independent folds from the child's screening constants, each with the full-fit budget)
    cv_fit_evals: int = 2
    # cv GROUPS: (fold name, the experiment names it holds out) of the --cv groups:FILE given
    cv_groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    front_cv: str = FRONT_CV_MODES[0]  # the protocol the front is scored with at the end of the run ("none": not)
    # share of symbolic children made by `modulate` (f.T -> f.T * (1 + k * f.n)); 0: not used
    modulate: float = 0.0
    # share made by `switch` (f.T -> (f.T * k if f.n > t else f.T), or + (k * X if f.n > t else 0))
    switch: float = 0.0
    time_components: str = TIME_COMPONENT_MODES[0]
    unexercised: str = UNEXERCISED_MODES[0]
    # check: every seed and child keeps the physics a search cannot trade away (evaluator/soundness.py:
    # the floor, causal inputs, no subtracted time, one role per constant; rejections "floor" and
    # "causal"), fits stay at or above the floor, inherited constants keep their first parent's bounds
    # and priors and new ones get a weak prior (docs/HISTORY.md, "Physics the search cannot trade away")
    physics: str = PHYSICS_MODES[0]

    def __post_init__(self):
        if not (self.cv in CV_MODES or self.cv.startswith(GROUPS_PREFIX) or (self.cv == GROUPS and self.cv_groups)):
            raise SearchError(f"--cv must be one of {', '.join(CV_MODES)} or {GROUPS_PREFIX}FILE, not {self.cv!r}")
        for name, modes in (
            ("units", UNITS_MODES),
            ("front_cv", FRONT_CV_MODES),
            ("linear", LINEAR_MODES),
            ("time_components", TIME_COMPONENT_MODES),
            ("unexercised", UNEXERCISED_MODES),
            ("physics", PHYSICS_MODES),
        ):
            if getattr(self, name) not in modes:
                raise ValueError(f"{name} must be one of {', '.join(modes)}, not {getattr(self, name)!r}")
        for flag, share in (("--modulate", self.modulate), ("--switch", self.switch)):
            if not 0.0 <= share < 1.0:
                raise SearchError(f"{flag} is a share of the children, from 0 up to 1: not {share}")
        if self.modulate + self.switch >= 1.0:
            raise SearchError(
                f"--modulate {self.modulate} and --switch {self.switch} leave no children to the other "
                "operators: their shares must add up to less than 1"
            )

    def goal(self) -> Objective:
        return Objective(self.objective, self.weights)

    def fold_groups(self) -> dict[str, list[str]]:
        """The stored groups of --cv groups:FILE, as crossval takes them."""
        return {fold: list(names) for fold, names in self.cv_groups}


NOT_IDENTITY = ("generations", "patience", "front_cv")  # a resumed run may change these
# the settings `evolve run` sets by a flag of the same name taking one value, and how a stored None
# is given on the command line (absent: None cannot be given, it is the flag's default)
RUN_FLAGS = (
    "children",
    "islands",
    "llm_ratio",
    "quick_evals",
    "quick_surrogate",
    "full_fit_evals",
    "seed_fit_evals",
    "full_fit_candidates",
    "full_fit_surrogate",
    "linear",
    "max_promotions",
    "migration_interval",
    "semantics",
    "prompt_reuse",
    "fit_method",
    "objective",
    "units",
    "cv",
    "cv_fit_evals",
    "modulate",
    "switch",
    "time_components",
    "unexercised",
    "physics",
)
NONE_AS = {"quick_surrogate": "0", "full_fit_surrogate": "0"}
# settings added after runs were first stored: an archive without them ran with these values
LEGACY_SETTINGS = {
    "fit_method": "cmaes",
    "objective": "rms",
    "weights": [],
    "units": "off",
    "cv": "none",
    "cv_fit_evals": 0,
    "cv_groups": [],
    "full_fit_candidates": 3,
    "full_fit_surrogate": None,
    "quick_surrogate": None,
    "linear": "sample",
    "prompt_reuse": LEGACY_PROMPT_REUSE,
    "modulate": 0.0,
    "switch": 0.0,
    "time_components": "free",
    "unexercised": "allow",
    "physics": "off",
}
# the fit budgets runs had before the search-speed work (`evolve bench --baseline` times them):
# the legacy values of the settings it added, and the full-fit budget it changed
PREVIOUS_FIT_BUDGETS = {
    "full_fit_evals": 12,
    **{
        k: LEGACY_SETTINGS[k]
        for k in ("full_fit_candidates", "full_fit_surrogate", "quick_surrogate", "cv_fit_evals", "linear")
    },
}


@dataclass(frozen=True)
class RunSettings:
    """What makes a run, as its archive stores it (in the run's config, as JSON)."""

    search: dict  # the search settings but NOT_IDENTITY
    llm: str | None = None  # the LLM model (None: none)
    seeds: dict[str, str] | None = None  # custom seeds, name -> content hash (None: the shipped seeds)

    @classmethod
    def of(
        cls, config: SearchConfig, llm: str | None = None, seeds: list[tuple[str, str]] | None = None
    ) -> RunSettings:
        """The settings of a run of `config` with this LLM and these seeds (name, source)."""
        search = _identity({k: v for k, v in dataclasses.asdict(config).items() if k not in NOT_IDENTITY})
        seed_ids = (
            None if seeds is None else {name: hashlib.sha256(src.encode()).hexdigest()[:16] for name, src in seeds}
        )
        return cls(json.loads(json.dumps(search)), llm, seed_ids)

    @classmethod
    def stored(cls, run_config: dict | None) -> RunSettings:
        """A stored run's settings, with the legacy value of each search setting it predates."""
        c = run_config or {}
        return cls(_identity({**LEGACY_SETTINGS, **(c.get("search") or {})}), c.get("llm"), c.get("seeds"))

    def to_json(self) -> dict:
        """As the run's config holds them."""
        return {"search": self.search, "llm": self.llm, "seeds": self.seeds}

    def differences(self, saved: RunSettings) -> str:
        """'children: run 5, now 7; seeds: ...' for the settings that differ from `saved`."""

        def flat(s: RunSettings) -> dict:  # the search settings side by side with the others
            return {"llm": s.llm, "seeds": s.seeds, **s.search}

        a, b = flat(saved), flat(self)
        return "; ".join(
            f"{k.replace('_', '-')}: run {a.get(k)}, now {b.get(k)}"
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)
        )

    def flags_of(self, saved: RunSettings) -> str:
        """The `evolve run` flags that give the settings of `saved` where these differ from them
        ('--quick-surrogate 0 --units off'), for those a flag can give."""
        flags = []
        for k in RUN_FLAGS:
            value = saved.search.get(k)
            if value == self.search.get(k) or (value is None and k not in NONE_AS):
                continue
            if k == "cv" and value not in CV_MODES:  # groups: the file the run was given is not stored
                continue
            flags.append(f"--{k.replace('_', '-')} {NONE_AS[k] if value is None else value}")
        return " ".join(flags)

    def check_resume(self, archive: Archive, run: RunRecord, data: LoadedData, resume: bool) -> None:
        """Whether `run`, the run in `archive`, may go on with these settings on `data`: a one-line
        SearchError saying why not."""
        if not resume:
            raise SearchError(
                f"{archive.dir} already holds a run ({archive.last_generation(run.id) + 1} generations "
                "completed): pass --resume to continue it, or choose another --archive"
            )
        if run.data_fingerprint != data.fingerprint():
            raise SearchError(
                f"{archive.dir}: the run used other data ({run.data_label}); cannot resume on {data.label}"
            )
        saved = RunSettings.stored(run.config)
        if saved != self:
            flags = self.flags_of(saved)
            raise SearchError(
                f"{archive.dir}: the run used other search settings ({self.differences(saved)}); "
                "resume with the settings it started with" + (f" ({flags})" if flags else "")
            )


def _identity(search: dict) -> dict:
    """The search settings that make a run what it is: the folds' budget only where there are folds."""
    return {k: v for k, v in search.items() if k != "cv_fit_evals" or search.get("cv", "none") != "none"}


def check_engine_resumable(engine: str, archive_dir: Path, resume: bool) -> None:
    """An OpenEvolve archive is resumed by neither engine, and OpenEvolve resumes no archive
    (checked before any data is loaded)."""
    if not resume or not (archive_dir / Archive.FILE).is_file():
        return
    try:
        stored = Archive.open(archive_dir)
        try:
            existing = stored.run()
        finally:
            stored.close()
    except (UserError, sqlite3.Error):
        return  # not an archive we can read: opening it for the run says so, in one line
    if existing is None:
        return
    if (existing.config or {}).get("engine") == "openevolve":
        raise SearchError(
            f"{archive_dir}: an --engine openevolve run cannot be resumed (OpenEvolve's population and "
            "random state are not in the archive, so a continued run would diverge); start a new --archive"
        )
    if engine == "openevolve":
        raise SearchError(f"{archive_dir}: --engine openevolve cannot resume a run; start a new --archive")


def check_seed_units(seeds: list[tuple[str, str]], where: Callable[[str], object] = "seed {}".format) -> None:
    """units "check": every seed (name, source) must be unit-consistent; a SearchError names the
    first that is not by `where(name)`, with its line and the rule."""
    for name, source in seeds:
        try:
            check_units(parse_program(source))
        except ProgramError as e:
            raise SearchError(f"{where(name)}: {e} (pass --units off to search from it anyway)") from None
