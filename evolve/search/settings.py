"""A search's settings, and what a resume checks against them.

`SearchConfig` is what a search is given, `LLMSettings` the LLM it may ask. `RunSettings` is the
part that makes a run what it is, as the archive stores it with the run and a resume must repeat:
the search settings but those a resumed run may change (`NOT_IDENTITY`), the LLM model and the
custom seeds (by content). A setting added after runs were first stored has a legacy value
(`LEGACY_SETTINGS`): the value an archive stored without it ran with.

The command line builds its options from this module: it imports nothing heavy at its top (what a
resume checks reads the archive, imported where it does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stepml_evolve.evaluator.choices import (
    DEFAULT_SEMANTICS,
    GROUPS,
    GROUPS_PREFIX,
    METHODS,
    PHYSICS_MODES,
    PROTOCOLS,
    SEMANTICS,
)
from stepml_evolve.evaluator.data.prompt_reuse import (
    DEFAULT_POLICY as DEFAULT_PROMPT_REUSE,
)
from stepml_evolve.evaluator.data.prompt_reuse import (
    LEGACY_POLICY as LEGACY_PROMPT_REUSE,
)
from stepml_evolve.evaluator.data.prompt_reuse import POLICIES as PROMPT_REUSE_POLICIES
from stepml_evolve.evaluator.dsl import ProgramError, check_units, parse_program
from stepml_evolve.evaluator.errors import UserError, shown
from stepml_evolve.evaluator.fit.config import QUICK_EVALS, QUICK_WINDOW
from stepml_evolve.evaluator.scoring.objectives import OBJECTIVES, Objective
from stepml_evolve.evolve.option_fields import option_fields, setting

if TYPE_CHECKING:  # the archive loads the replay's metric rows
    from stepml_evolve.archive.records import RunRecord
    from stepml_evolve.archive.store import Archive
    from stepml_evolve.evaluator.datasets import LoadedData

CV_MODES = ("none", *PROTOCOLS)  # --cv: what a full fit's validation loss is (none: the validation windows)
# and groups:FILE, which a run stores as GROUPS with the file's folds (cv_groups)
FRONT_CV_MODES = (*PROTOCOLS, "none")  # --front-cv: how the Pareto front is cross-validated when a run ends
# (and groups:FILE, which the run's end reads from the file)
# --guard-cv: the second question guarded's pick must answer at a run's end (the same modes): on the
# real data the child LOMO alone deployed was 2.2x worse than its seed leaving one workload out
GUARD_CV_DEFAULT = "lowo"
LINEAR_MODES = ("sample", "solve")  # --linear: how a fit's surrogate step finds the constants a program is affine in
UNITS_MODES = ("check", "off")  # check: seeds and children must be unit-consistent (evaluator/dsl/units.py)
# keep: a child must use every time component (f.gemm_pf ... f.allreduce) its first parent uses;
# the default since the worlds' benchmark (docs/HISTORY.md "Keeping every time component")
TIME_COMPONENT_MODES = ("keep", "free")
# reject: a child may not use a component the data never varies (f.allreduce when every experiment
# runs at tp 1, f.tp at one TP) more often than its first parent does (docs/HISTORY.md, "Terms the
# train configurations cannot judge")
UNEXERCISED_MODES = ("reject", "allow")
# --residual-refit: when residual_term screens its terms beside the parent's refitted constants
# (evaluator/discovery/refit.py) rather than at them: where none passes at them, always, or never
RESIDUAL_REFIT_MODES = ("fallback", "always", "never")
ENGINES = ("mapelites", "openevolve")  # --engine: our MAP-Elites loop, or OpenEvolve's controller over our evaluator
DEFAULT_TIMEOUT_S = 60.0  # seconds an LLM call may take in all before it is cancelled (then retried; llm_client.py)
# the deadlines a call may be given (`--llm-timeout`): a call cannot be answered in less than a
# tenth of a second (0, a negative or NaN deadline fails every call at once, and the breaker then
# shuts the LLM out), and one still running after a day is hung (inf overflows the wait)
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.1, 86_400.0


# help texts of settings SearchConfig shares with EvaluationSetup (evolve/commands/evaluation_setup.py)
SEMANTICS_HELP = (
    "How the replay accounts a step: blis (as BLIS does, so fitted constants mean the same in the "
    "simulator) or vllm (see docs/concepts/design-notes.md)."
)
PROMPT_REUSE_HELP = (
    "Which requests sent the same prompt, for the replay's prefix cache: detect (a prompt list the client "
    "cycled through, found in the input lengths, plus shared system prompts; system prompts only when the "
    "lengths show no cycle), system-prompt (only the system prompts are shared) or off (nothing is)."
)
OBJECTIVE_HELP = (
    "The loss: rms (RMS APE of mean E2E + RMS APE of mean TTFT over experiments) or worst3 (mean of the "
    "three worst experiments' APE of mean E2E)."
)
PHYSICS_HELP = (
    "check: refuse a program below the physical floor (the roofline of a step's work at the hardware's "
    "peak, on an envelope of steps users simulate, each branch of a condition on its own), one that takes "
    "time away (a subtracted time, a negative constant, a difference of constants or a branch that can be "
    "negative), counts a component twice in one sum, shares a constant between roles, reads an input that "
    "cannot cause its time, or switches at a threshold outside the envelope; keep fits at or above the "
    "floor, and fail a replay at a step below it; off: none of these (a regression such as BLIS's blackbox)."
)
EMIT_PHYSICS_HELP = (
    "check: refuse a program --physics check would refuse, and have the Go panic, naming the step, at a "
    "step below its physical floor rather than clamp it; off: emit it as it is (a step must still take more "
    "than 0)."
)
OPERATOR_SHAPES = {  # what the opt-in symbolic operators make
    "modulate": "a time component f.T becomes f.T * (1 + k * f.n) or f.T * (1 + k / f.n) for a count n of the step",
    "switch": "a change of regime at a fitted threshold t of a step's count n: f.T becomes "
    "(f.T * k if f.n > t else f.T), or the step time gains + (k * X if f.n > t else 0)",
}
RESIDUAL_SHARE = 0.2  # the default share of residual_term children (docs/results/search.md)
PARENT_RULES = {"time_components": TIME_COMPONENT_MODES, "unexercised": UNEXERCISED_MODES}  # (on, off)
PARENT_RULE_HELP = {  # what each rule of PARENT_RULES does when on, and what its off mode allows
    "time_components": "reject a child that drops a time component (f.gemm_pf ... f.allreduce) its first "
    "parent uses, rule 'time-components'; free: children may drop them",
    "unexercised": "reject a child that uses a component the data never varies (f.allreduce when every "
    "experiment runs at tp 1, f.tp at one TP, f.layers of one model) more often than its first parent, "
    "rule 'unexercised': no fit can judge such a term; allow: admit them",
}


def _surrogate_help(whose: str) -> str:
    return f"{whose} (trust region): surrogate evaluations per iteration (0: 200 + 40 per constant)."


def _share_help(operator: str, what: str) -> str:
    return f"Share of the symbolic children made by `{operator}`: {what} (0: not used)."


def _parent_rule_help(name: str) -> str:
    on, off = PARENT_RULES[name]
    return f"{on} (the default): {PARENT_RULE_HELP[name]} (--engine openevolve runs with {off} and refuses {on})."


class SearchError(UserError, RuntimeError):
    """The search cannot go on; the message is one line."""


@dataclass(frozen=True)
class SearchConfig:
    """A search's settings. The fields with a flag are `evolve run`'s options (evolve/option_fields.py):
    their help is the documentation of the setting."""

    generations: int = setting(500, "Generations to complete (generation 0 fits the seeds).", min=0)
    seed: int = setting(7, "Same seed and data give the same archive (offline).", min=0)
    children: int = setting(8, "Children per generation.", min=1)
    llm_ratio: float = setting(0.5, "Share of children asked of the LLM; the rest are symbolic.", min=0.0, max=1.0)
    # full fits dominate a generation's time
    max_promotions: int = setting(2, "Full fits per generation at most.", min=0)
    promote_margin: float = 0.05  # promote when the quick loss is within 5% of the reference it must beat
    sanity_factor: float = 3.0  # never promote a quick loss above 3x the best screening loss
    quick_evals: int | None = setting(
        None,
        "Screening-fit budget per child (closed-loop evaluations; default by --fit-method: "
        + ", ".join(f"{n} {m}" for m, n in QUICK_EVALS.items())
        + ").",
        min=1,
    )
    # 80 made the same promotions as 200 + 40 n in 15 of 17 generations of the real-data run for a
    # fifth less CPU: docs/HISTORY.md "Screening with 80 surrogate evaluations"
    quick_surrogate: int | None = setting(80, _surrogate_help("A screening fit"), min=0, zero_is_none=True)
    quick_window: float = setting(
        QUICK_WINDOW,
        "A screening fit: the share of each screening experiment's requests it replays (the first ones).",
        min=0.05,
        max=1.0,
    )
    full_fit_evals: int | None = setting(8, "Full-fit budget for promoted children (default by --fit-method).", min=1)
    full_fit_sigma: float = 0.2
    # a seed program's flags say so: --seed is the random seed
    seed_fit_evals: int | None = setting(
        None,
        "Fit budget for the seed programs (default: the standard fit).",
        min=1,
        flag="--seed-program-fit-evals",
    )
    seed_starts: int = setting(
        3,
        "Fits of each seed program in generation 0: from its own constants and from draws from their "
        "priors, the best kept, so a child's gain over its seed is its structure's and not a luckier start's.",
        min=1,
        flag="--seed-program-starts",
    )
    full_fit_starts: int = setting(
        1,
        "Fits of each promoted child: from its screening constants and from draws from their priors, "
        "the best kept (each start costs a full fit; 1: the screening constants only).",
        min=1,
    )
    # seed fits keep the standard fit's trust region; docs/HISTORY.md "Search speed" measured what these buy
    full_fit_candidates: int = setting(
        1, "A promoted child's fit (trust region): closed-loop judged points per iteration.", min=1
    )
    # 60 made the same promotions as 150 in 12 of 12 generations of the real-data run for 0.89x the
    # CPU, the same children's full fits within the fit's noise: docs/HISTORY.md "A promoted child's
    # surrogate: 60 evaluations an iteration"
    full_fit_surrogate: int | None = setting(60, _surrogate_help("A promoted child's fit"), min=0, zero_is_none=True)
    # "solve" ended worse on four seeds of five in promoted fits (docs/HISTORY.md), so "sample" stays the default
    linear: str = setting(
        LINEAR_MODES[0],
        "sample: CMA-ES samples every constant on the surrogate; solve: screening and promoted "
        "fits solve the constants a program is affine in by least squares and sample the others "
        "(faster; lower-quality full fits, docs/HISTORY.md).",
        choices=LINEAR_MODES,
    )
    islands: int = setting(1, "Independent islands with periodic migration of their best.", min=1)
    migration_interval: int = setting(25, "Generations between migrations (with --islands > 1).", min=1)
    semantics: str = setting(DEFAULT_SEMANTICS, SEMANTICS_HELP, choices=SEMANTICS)
    prompt_reuse: str = setting(DEFAULT_PROMPT_REUSE, PROMPT_REUSE_HELP, choices=PROMPT_REUSE_POLICIES)
    fit_method: str = setting(METHODS[0], "How constants are fitted (see evolve fit --method).", choices=METHODS)
    objective: str = setting("rms", OBJECTIVE_HELP, choices=OBJECTIVES)
    weights: tuple[
        tuple[str, float], ...
    ] = ()  # (experiment-name pattern, weight); see evaluator/scoring/objectives.py
    patience: int | None = setting(
        None,
        "Stop once the best validation loss has not improved by more than 0.5% for this many generations.",
        min=1,
    )
    units: str = setting(
        UNITS_MODES[0],
        "check: reject a seed or child whose step time is not a time (e.g. microseconds plus a count), "
        "rule 'units'; off: no units check.",
        choices=UNITS_MODES,
    )
    cv: str = setting(
        CV_MODES[0],
        "none: a promoted child's validation loss is its loss on the validation windows; lomo/lowo: its "
        "full fit is also the fold fits of leave-one-model-(workload-)out, and its validation loss is the "
        "CV loss; groups:FILE: the folds of a groups file (YAML: fold name -> experiment names it holds "
        "out), as `evolve cv` reads it.",
    )
    cv_fit_evals: int = setting(
        2,
        "With --cv: closed-loop evaluations of each fold's fit, warm-started from the full fit "
        "(0: independent folds with the full-fit budget each, as evolve cv fits them; about 3x the time).",
        min=0,
    )
    # cv GROUPS: (fold name, the experiment names it holds out) of the --cv groups:FILE given
    cv_groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    front_cv: str = setting(
        FRONT_CV_MODES[0],
        "When the run ends, cross-validate the Pareto front members and the seed programs with this "
        "protocol (lomo, lowo, or groups:FILE: the folds of a groups file, for a question the models and "
        "workloads do not ask, such as another GPU or deployment style) and store the scores the "
        "deployment rules rank by (none: skip).",
    )
    # docs/HISTORY.md, "guarded asks its pick a second question at the run's end"
    guard_cv: str = setting(
        GUARD_CV_DEFAULT,
        "When the run ends, ask the program `guarded` would deploy, if it is not a seed, and its seed a "
        "second question: cross-validate both with this protocol (lomo, lowo or groups:FILE) and keep the "
        "child only if it beats its seed there too; else ask the next one (none: skip; the protocol of "
        "--front-cv: nothing to ask).",
    )
    explain: bool = setting(
        True,
        "When the run ends, explain its best and its deployed program (where each one's error grows, the "
        "terms screened on its residuals: evolve explain) and store it for the report.",
        flag="--explain/--no-explain",
    )
    baselines: bool = setting(
        True,
        "When the run ends, fit the baselines (BLIS's blackbox regression, without the floor it does not "
        "keep) as generation 0 fits a seed, and show their losses beside the best and the deployed program.",
        flag="--baselines/--no-baselines",
    )
    modulate: float = setting(0.0, _share_help("modulate", OPERATOR_SHAPES["modulate"]), min=0.0, max=0.99)
    switch: float = setting(0.0, _share_help("switch", OPERATOR_SHAPES["switch"]), min=0.0, max=0.99)
    residual: float = setting(
        RESIDUAL_SHARE,
        "Share of children made by `residual_term`: the parent plus the term that best explains its "
        "per-request residuals on its own schedule, screened in closed form from a typed library of "
        "physically valid terms (hinges, logs, overheads, switches, efficiencies; evolve explain shows the "
        "residuals) and checked against held-out groups and chance (0: not used).",
        min=0.0,
        max=0.99,
    )
    residual_refit: str = setting(
        RESIDUAL_REFIT_MODES[0],
        "When `residual_term` screens its terms beside the parent's own constants refitted with each "
        "(a fit soaks up part of a mechanism the program lacks, so at its constants the term shows "
        "only what is left): fallback, where no term passes at the parent's constants; always; never.",
        choices=RESIDUAL_REFIT_MODES,
    )
    # the default since the worlds' benchmark (docs/HISTORY.md "Keeping every time component")
    time_components: str = setting(
        TIME_COMPONENT_MODES[0], _parent_rule_help("time_components"), choices=TIME_COMPONENT_MODES, unset=True
    )
    # docs/HISTORY.md, "Terms the train configurations cannot judge"
    unexercised: str = setting(
        UNEXERCISED_MODES[0], _parent_rule_help("unexercised"), choices=UNEXERCISED_MODES, unset=True
    )
    # inherited constants keep their first parent's bounds and priors and new ones get a weak prior
    # (docs/HISTORY.md, "Physics the search cannot trade away")
    physics: str = setting(PHYSICS_MODES[0], PHYSICS_HELP, choices=PHYSICS_MODES)

    def __post_init__(self):
        if not (self.cv in CV_MODES or self.cv.startswith(GROUPS_PREFIX) or (self.cv == GROUPS and self.cv_groups)):
            raise SearchError(f"--cv must be one of {', '.join(CV_MODES)} or {GROUPS_PREFIX}FILE, not {self.cv!r}")
        for flag, mode in (("--front-cv", self.front_cv), ("--guard-cv", self.guard_cv)):
            if not (mode in FRONT_CV_MODES or mode.startswith(GROUPS_PREFIX)):
                raise SearchError(
                    f"{flag} must be one of {', '.join(FRONT_CV_MODES)} or {GROUPS_PREFIX}FILE, not {mode!r}"
                )
        for name, modes in (
            ("units", UNITS_MODES),
            ("linear", LINEAR_MODES),
            ("time_components", TIME_COMPONENT_MODES),
            ("unexercised", UNEXERCISED_MODES),
            ("physics", PHYSICS_MODES),
            ("residual_refit", RESIDUAL_REFIT_MODES),
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


@dataclass(frozen=True)
class LLMSettings:
    """The LLM side of a search: which model, where, and its caps (None: no cap)."""

    model: str
    base_url: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    offline: bool = False  # replay replies from the cache only
    max_calls: int | None = None
    max_tokens: int | None = None
    max_usd: float | None = None

    def __post_init__(self):  # the range --llm-timeout has, for a search started from Python
        if not MIN_TIMEOUT_S <= self.timeout_s <= MAX_TIMEOUT_S:  # NaN fails it too
            raise SearchError(
                f"the LLM timeout must be {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} seconds, not {shown(self.timeout_s)}"
            )


# a resumed run may change these
NOT_IDENTITY = ("generations", "patience", "front_cv", "guard_cv", "explain", "baselines")
# the settings `evolve run` sets by a flag taking one value that a resume must repeat, and how a
# stored None is given on the command line (absent: None cannot be given, it is the flag's default)
RUN_FLAGS = tuple(f.name for f in option_fields(SearchConfig) if f.name not in (*NOT_IDENTITY, "seed"))
OPTS = {f.name: f.opt for f in option_fields(SearchConfig)}
NONE_AS = {f.name: "0" for f in option_fields(SearchConfig) if f.flag.zero_is_none}
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
    "quick_window": QUICK_WINDOW,
    "linear": "sample",
    "prompt_reuse": LEGACY_PROMPT_REUSE,
    "modulate": 0.0,
    "switch": 0.0,
    "time_components": "free",
    "unexercised": "allow",
    "physics": "off",
    "residual": 0.0,
    "residual_refit": "never",
    "seed_starts": 1,
    "full_fit_starts": 1,
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
            flags.append(f"{OPTS[k]} {NONE_AS[k] if value is None else value}")
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
    from stepml_evolve.archive.store import Archive

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


def check_seed_units(seeds: list[tuple[str, str]], where: Callable[[str], object] = "seed program {}".format) -> None:
    """units "check": every seed (name, source) must be unit-consistent; a SearchError names the
    first that is not by `where(name)`, with its line and the rule."""
    for name, source in seeds:
        try:
            check_units(parse_program(source))
        except ProgramError as e:
            raise SearchError(f"{where(name)}: {e} (pass --units off to search from it anyway)") from None
