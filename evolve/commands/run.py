"""`evolve run`: a search assembled from its settings (data, archive, seeds, LLM, emitters,
engine) and run to its last generation with live progress; returns the summary it stored."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.archive.access import RUNS_DIR
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.dsl import parse_program
from stepml_evolve.evaluator.errors import UserError, printable
from stepml_evolve.evaluator.fit.crossval import GROUPS, GROUPS_PREFIX, make_folds, read_groups, summarize
from stepml_evolve.evaluator.fit.fitting import ProgressFn
from stepml_evolve.evaluator.numbers import finite
from stepml_evolve.evaluator.outputs import OutputError, slug
from stepml_evolve.evaluator.physics.floor import envelope_for
from stepml_evolve.evaluator.say import Say, quiet
from stepml_evolve.evolve.deploy.front_cv import deployed_summary, run_fit_settings, score_front
from stepml_evolve.evolve.deploy.pins import pin_deployed
from stepml_evolve.evolve.search import Search, SearchConfig, SearchError, check_engine_resumable, check_seed_units
from stepml_evolve.evolve.search.emitters import build_emitters
from stepml_evolve.evolve.search.residual_terms import ResidualSource
from stepml_evolve.evolve.search.settings import ENGINES, OPTS, PARENT_RULES, LLMSettings
from stepml_evolve.seeds import baseline_paths, load_seeds

from .evaluation_setup import EvaluationSetup, Terminated, no_progress
from .explain import record_explanations

SearchProgress = Callable[
    [int, int], AbstractContextManager[ProgressFn]
]  # opens a display for (last, first) generation


@dataclass
class RunOutcome:
    archive_dir: Path
    summary: dict  # Search.summary(): best program, its test rows, the front

    def to_json(self) -> dict:
        return {"archive": str(self.archive_dir), **self.summary}


def default_archive_dir(loaded: LoadedData, seed: int) -> Path:
    """runs/<data directory name>-seed<seed> (runs/synthetic-seed<seed> for the sample)."""
    tag = "synthetic" if loaded.synthetic else slug(Path(loaded.label).name)
    return RUNS_DIR / f"{tag}-seed{seed}"


def _seed_file(paths: list[Path], name: str) -> Path | str:
    """The file load_seeds read seed `name` from: a file given by path, or <directory>/<name>.py."""
    for p in paths:
        if p.is_dir() and (p / f"{name}.py").is_file():
            return p / f"{name}.py"
        if not p.is_dir() and p.stem == name:
            return p
    return name


def _llm_client(llm: LLMSettings, archive_dir: Path):
    from stepml_evolve.evolve.search.llm_client import LLMClient
    from stepml_evolve.evolve.search.llm_operator import Budget

    client = LLMClient(
        llm.model, archive_dir / "llm_cache", base_url=llm.base_url, timeout_s=llm.timeout_s, offline=llm.offline
    )
    return client, Budget(max_calls=llm.max_calls, max_tokens=llm.max_tokens, max_usd=llm.max_usd)


def _server(loaded: LoadedData) -> dict:
    """The scheduler limits the system prompt quotes (those of the first experiment)."""
    s = loaded.experiments[0].server
    return {"budget_tokens": s.max_num_batched_tokens, "max_seqs": s.max_num_seqs}


def _llm_operator(llm: LLMSettings, archive_dir: Path, loaded: LoadedData, config: SearchConfig):
    from stepml_evolve.evolve.search.llm_operator import LLMOperator

    client, budget = _llm_client(llm, archive_dir)
    return LLMOperator(
        client,
        budget,
        server=_server(loaded),
        units=config.units == "check",
        keep_time_components=config.time_components == "keep",
        envelope=envelope_for(loaded.experiments) if config.physics == "check" else None,
    )


def check_engine(engine: str, llm: LLMSettings | None) -> None:
    """What --engine openevolve needs (OpenEvolve 0.4 installed, an LLM): one-line errors before
    any data is loaded."""
    if engine not in ENGINES:
        raise SearchError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine != "openevolve":
        return
    from stepml_evolve.evolve.openevolve.engine import require_openevolve

    require_openevolve()
    if llm is None:
        raise SearchError("--engine openevolve needs an LLM: pass --llm MODEL (and --llm-base-url for a local server)")


# the settings whose rule compares a child with its first parent: (on, off) modes
def engine_rule(engine: str, name: str, chosen: str | None) -> str:
    """A setting of PARENT_RULES for an engine (chosen: None when its option was not given).
    OpenEvolve's candidates reach our judge without their parent, so there is nothing to compare
    with: it runs with the rule off and refuses an explicit on."""
    on, off = PARENT_RULES[name]
    if engine != "openevolve":
        return chosen or getattr(SearchConfig, name)
    if chosen == on:
        raise SearchError(
            f"{OPTS[name]} {on}: --engine openevolve's candidates reach the judge without their "
            f"parent, so there is no parent to compare with; leave the option out (openevolve runs with {off})"
        )
    return off


def _check_setup(config: SearchConfig, setup: EvaluationSetup) -> None:
    """A run reads its data and replays as its config says (the archive stores the config, and
    --resume and `archive cv` go by it), so the setup must say the same."""
    if (setup.output_len, setup.semantics, setup.prompt_reuse, setup.objective) != (
        "profile",
        config.semantics,
        config.prompt_reuse,
        config.objective,
    ):
        raise ValueError(
            "the setup's output length, semantics, prompt reuse and objective must be the run's "
            "(profile and its config's)"
        )


def run_search(
    config: SearchConfig,
    setup: EvaluationSetup = EvaluationSetup(),
    archive_dir: Path | None = None,
    *,
    resume: bool = False,
    seeds: list[Path] | None = None,
    llm: LLMSettings | None = None,
    engine: str = ENGINES[0],
    diffs: bool = True,
    say: Say = quiet,
    progress: SearchProgress = no_progress,
) -> RunOutcome:
    """Run (or with resume, continue) the search in `archive_dir` (default: `default_archive_dir`).
    setup: the data, and where replays run (threads, or a Ray cluster: the archive is the same);
    its weights file is read into config.weights, so the run stores the weights, not the path.
    seeds: program files or directories for generation 0 instead of the shipped seeds/. Without
    an LLM every child is symbolic, whatever config.llm_ratio says. engine: "openevolve" hands
    generations 1.. to OpenEvolve (evolve/openevolve/engine.py; diffs: whether it asks the LLM for
    SEARCH/REPLACE diffs, its default, or full rewrites)."""
    _check_setup(config, setup)
    check_engine(engine, llm)
    for name in PARENT_RULES:  # openevolve refuses keep and reject
        engine_rule(engine, name, getattr(config, name))
    if archive_dir is not None:
        check_engine_resumable(engine, archive_dir, resume)  # before any data is loaded
    seed_programs = load_seeds(seeds) if seeds else None  # bad seeds fail before any data is loaded
    if seed_programs and config.units == "check":  # checked here, before any data is loaded, to name the file
        check_seed_units(seed_programs, lambda name: _seed_file(seeds, name))
    if archive_dir is not None and archive_dir.exists() and not archive_dir.is_dir():
        raise OutputError(f"{archive_dir}: is a file; --archive takes a directory")
    loaded = setup.load(say)
    if setup.weights is not None:
        config = dataclasses.replace(config, weights=setup.goal(loaded).weights)
    if config.cv.startswith(GROUPS_PREFIX):  # the run stores the folds, not the file (as it stores the weights)
        groups = read_groups(Path(config.cv[len(GROUPS_PREFIX) :]), [e.name for e in loaded.experiments])
        config = dataclasses.replace(
            config, cv=GROUPS, cv_groups=tuple((fold, tuple(names)) for fold, names in groups.items())
        )
    if config.cv != "none":  # folds the data cannot make fail here, before an archive is written
        make_folds(config.cv, loaded.experiments, config.fold_groups())
    for end_cv in (config.front_cv, config.guard_cv):  # a groups file the run's end cannot read fails now, not then
        if end_cv.startswith(GROUPS_PREFIX):
            make_folds(end_cv, loaded.experiments)
    if archive_dir is None:
        archive_dir = default_archive_dir(loaded, config.seed)
        check_engine_resumable(engine, archive_dir, resume)  # the default directory is known only now
    if resume and not (archive_dir / Archive.FILE).exists():
        say(f"{printable(str(archive_dir))}: no archive yet, starting a new run")
    if llm is None:
        config = dataclasses.replace(config, llm_ratio=0.0)
    if resume and (archive_dir / Archive.FILE).exists():
        archive = Archive.open(archive_dir, writable=True)  # an empty or damaged file is refused, never started anew
    else:
        archive = Archive(archive_dir, create=True)
    try:
        outside = engine == "openevolve"
        operator = _llm_operator(llm, archive_dir, loaded, config) if llm and not outside else None
        run_config = {
            "data": loaded.label,
            "llm": llm.model if llm else None,
            "llm_base_url": llm.base_url if llm else None,
            "engine": engine,
        }
        with setup.replay_pool(loaded, floor=config.physics == "check") as pool:
            search = Search(
                archive,
                loaded,
                pool,
                config,
                build_emitters(
                    operator,
                    config.llm_ratio,
                    config.modulate,
                    config.switch,
                    causal=config.physics == "check",
                    residual=config.residual,
                    source=ResidualSource(pool, loaded.experiments, config.residual_refit)
                    if config.residual > 0 or operator
                    else None,
                ),
                resume=resume,
                run_config=run_config,
                seeds=seed_programs,
                seeds_checked=seed_programs is not None,
            )
            start = archive.last_generation(search.run_id) + 1
            if start > config.generations:
                say(f"{printable(str(archive_dir))}: already at generation {start - 1}; nothing to run")
            elif search.out_of_patience():
                say(
                    f"{printable(str(archive_dir))}: stopped by --patience {config.patience} at generation {start - 1}; nothing to run"
                )
            else:
                say(f"archive: {printable(str(archive_dir))}  (generations {start}..{config.generations})")
            try:
                with progress(config.generations, start) as on_progress:
                    search.progress = on_progress
                    if outside:
                        from stepml_evolve.evolve.openevolve.engine import OUTPUT_DIR, run_openevolve

                        client, budget = _llm_client(llm, archive_dir)
                        summary = run_openevolve(
                            search,
                            client,
                            budget,
                            archive_dir / OUTPUT_DIR,
                            config.generations,
                            islands=config.islands,
                            migration_interval=config.migration_interval,
                            server=_server(loaded),
                            llm_timeout_s=llm.timeout_s,
                            diffs=diffs,
                        )
                    else:
                        summary = search.run()
            except SearchError as e:
                raise SearchError(f"{archive_dir}: {e}") from None
            if config.front_cv != "none":
                summary = score_front(archive, search.run_id, loaded, pool, config, summary, say)
            fitted_as = run_fit_settings(archive.run(search.run_id)).config
            summary = pin_deployed(archive, search.run_id, loaded, pool, fitted_as, summary, say)
            summary = {**summary, **deployed_summary(archive)}
            if config.baselines:  # BLIS's regression beside the best and the deployed program
                summary = {**summary, "baselines": _baselines(search, say)}
                archive.set_summary(search.run_id, summary)
            if config.explain:  # where the best and the deployed programs' errors grow, for the report
                ids = [p["id"] for p in (summary.get("best"), summary.get("deployed")) if p]
                record_explanations(archive, search.run_id, ids, loaded, pool, say)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated): say what the archive keeps
        say(_kept(archive, archive_dir, e))
        raise
    finally:
        archive.close()
    return RunOutcome(archive_dir, summary)


def _baselines(search: Search, say: Say) -> list[dict]:
    """The shipped baselines fitted as the run fits a seed (one start, without the floor) and
    scored on its splits: what its programs are compared with, never one of them."""
    named = [(p.stem, parse_program(p.read_text())) for p in baseline_paths()]
    say(f"fitting the baselines ({', '.join(n for n, _ in named)}) for comparison (--no-baselines skips this)")
    out = []
    for (name, _), full in zip(named, search.cascade.baseline_fits([prog for _, prog in named])):
        test = summarize([r for r in full.rows if r.split == "test"])["e2e"]["mean"]
        out.append(
            {
                "name": name,
                "train_loss": full.train_loss,
                "val_loss": full.val_loss,
                "test_loss": full.test_loss,
                "test_e2e_ape": test if finite(test) else None,
            }
        )
    return out


def _kept(archive: Archive, archive_dir: Path, stop: KeyboardInterrupt) -> str:
    """The line a stopped run ends with: what stopped it, what its archive keeps (every completed
    generation; the one under way is redone on resume) and how to continue."""
    what = f"stopped by {stop.name}" if isinstance(stop, Terminated) else "interrupted"
    path = printable(str(archive_dir))
    resume = f"`evolve run --resume --archive {path}` with the same options"
    try:
        run = archive.run()
        last = archive.last_generation(run.id) if run is not None else -1
    except UserError:  # the archive cannot say (a failed disk): the rule still holds
        return f"{what}: {path} keeps every completed generation; {resume} continues after the last one"
    kept = f"generations 0 to {last}" if last >= 0 else "no completed generation"
    return f"{what}: {path} keeps {kept}; {resume} continues from generation {last + 1}"
