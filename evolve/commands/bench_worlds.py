"""`evolve bench --worlds`: does the search find laws that generalize? Per known-truth world
(evaluator/known_truth) and held-out split, the held-out error of every seed fitted on the train
configurations, of a search's winner (`evolve run` on the train configurations only, its best
program by the default deployment rule), and of the world's own law refitted the same way (the
noise floor). "Recovered": the winner's held-out loss is within RECOVERY_FACTOR of the law's and
below the best seed's (a law refitted worse than a seed makes recovering it no feat).

Every program is scored the one way `evolve cv --protocol groups:split-<name>.yaml` scores it:
constants fitted on the configurations the split trains on, then all requests of the held-out
ones replayed. The best seed is the one with the lowest held-out loss: the strongest baseline the
seeds offer, chosen with hindsight no user has.

Fairly: every program is scored from constants a fit on the train configurations already gave it,
the seeds as the search fitted them in its generation 0, the winner as the search kept it, and the
law as a seed's generation-0 fit takes it from its true constants, so a winner that is a seed
scores exactly as that seed does and fit luck is shared alike; each split is searched with `--search-seeds` search seeds (a
result per seed: a world's row moves with the search seed as much as with the operators); and each
deployment rule of archive/deployment.py (RULES) is scored held out beside the winner (the default
rule's pick), so the rules can be compared on data no rule saw.

The benchmark is many searches, more than one sitting at the default budget, so it keeps its work
in --out as it goes and `--resume` continues it: each world's data once generated (world.json is
written last), each split's seed and law scores, each search's archive (resumed from its last
completed generation), each split's result. A resumed benchmark with more --generations extends
every search and scores its new winner; the other settings must be the ones it started with.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from stepml_evolve.archive.access import opened, run_programs
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.choices import HELD_OUT_FITS
from stepml_evolve.evaluator.datasets import LoadedData, load_data
from stepml_evolve.evaluator.dsl import Program, parse_program
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fit.crossval import GROUPS_PREFIX, Fold, cross_validate, make_folds
from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants
from stepml_evolve.evaluator.fit.starts import drawn_start
from stepml_evolve.evaluator.known_truth import GRIDS, SPLITS, load_world, world_names, write_world
from stepml_evolve.evaluator.known_truth.generate import WORLD_FILE, world_identity
from stepml_evolve.evaluator.known_truth.splits import grid_splits, split_file
from stepml_evolve.evaluator.outputs import check_output_dir, write_atomic
from stepml_evolve.evaluator.say import Say, quiet
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.deploy.rules import DEFAULT_RULE, RULES, choose
from stepml_evolve.evolve.deploy.scores import cv_by_program
from stepml_evolve.evolve.search import FRONT_CV_MODES, SearchConfig
from stepml_evolve.seeds import baseline_paths, seed_paths

from .bench_worlds_results import RESULT_SUFFIX, HeldOut, SplitResult, _held_out_of, archive_of
from .evaluation_setup import EvaluationSetup
from .run import ENGINES, LLMSettings, check_engine, engine_rule, run_search

# how the baselines are scored: "as-searched" (the seeds as the search fitted them, the law after a seed's
# fit), or "from-files" (every seed from its file and the law from its truth, benchmarks stored before)
BASELINES = ("as-searched", "from-files")
DEFAULT_SEARCH_SEEDS = 2  # search seeds per split (the quick benchmark: 1)
# A winner whose train loss is within this factor of the law's (or below it) fits the configurations
# the search saw as well as the law does: those configurations cannot tell the two apart, so no rule
# that selects by them could have preferred the law (SplitResult.diagnosis)
TRAIN_TIE = 1.1
QUICK_WORLDS = ("launch_bound", "cuda_graph_buckets")
QUICK_GENERATIONS = 2
QUICK_SPLITS = ("by-gpu",)
SELECTIONS = ("validation", "inner")  # how a search picks its winner (see bench_world)
# which of a program's --held-out-fits scores it: the fit with the lowest train loss (a multi-start
# fit, what a user keeps), or the median of the fits' held-out losses (the benchmark's first rule)
PICKS = ("train", "median")
SETTINGS_FILE = "bench-worlds.settings.json"  # what a resumed benchmark must match
# --front-cv inner: a search's end cross-validates its front with the split's own question asked
# inside its train configurations (by-workload: a trained workload held out; by-gpu: a trained GPU),
# and the deployment rules rank by it (docs/results/physics.md, "Guarded ranked by the split's own question")
INNER_FRONT_CV = "inner"
FRONT_CVS = (*FRONT_CV_MODES, INNER_FRONT_CV)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot be read as the benchmark's JSON ({e}); remove it to redo that part") from None


def _write_json(path: Path, value) -> None:
    write_atomic(path, json.dumps(value, indent=1) + "\n")


def _held_out(
    name: str,
    program: Program,
    loaded: LoadedData,
    pool: ReplayPool,
    protocol: str,
    folds: list[Fold],
    seed: int,
    fits: int = 1,
    max_evals: int | None = None,
    pick: str = PICKS[0],
) -> HeldOut:
    """The program fitted on the split's train configurations `fits` times, as a search fits its
    seeds (evaluator/fit/starts.py: from its own constants with fit seed `seed`, then from draws
    from its priors with seeds seed + 1, ...), and scored held out by one fit, with every fit's
    held-out and train loss: the fit with the lowest train loss (pick "train": the held-out data
    never chooses), or the median held-out loss ("median"). One fit's held-out loss depends on where
    its optimizer ended (docs/HISTORY.md): a program with a world's own structure, fitted from
    generic starting constants, ends 1.4-2.9x above the law's held-out loss, in the order of its
    train losses."""
    scored = []
    rng = np.random.default_rng([seed, 0x5EED])
    for k in range(fits):
        start = dict(program.constants) if k == 0 else drawn_start(program, program.constants, rng)
        cv = cross_validate(
            program,
            loaded.experiments,
            pool,
            protocol,
            folds,
            FitConfig(seed=seed + k, max_evals=max_evals),
            start=start,
        )
        summary = cv.summary()
        train = sum(f.fit.loss for f in cv.folds) / len(cv.folds)
        scored.append((cv.loss, *(summary.get(m, {}).get("mean", math.inf) for m in ("e2e", "ttft")), train))
    if pick == "train":
        loss, e2e, ttft, train = min(scored, key=lambda x: (math.isnan(x[3]), x[3]))  # a NaN loss ranks last
    else:
        ranked = sorted(scored, key=lambda x: (math.isnan(x[0]), x[0]))
        loss, e2e, ttft, train = ranked[(fits - 1) // 2]  # the lower middle one of an even count
    if fits == 1:
        return HeldOut(name, loss, e2e, ttft, train_loss=train)
    return HeldOut(name, loss, e2e, ttft, tuple(x[0] for x in scored), tuple(x[3] for x in scored), train)


@dataclass(frozen=True)
class SplitScorer:
    """How a split scores every program held out (`_held_out` with the benchmark's fits and pick)."""

    loaded: LoadedData
    pool: ReplayPool
    protocol: str
    folds: list[Fold]
    seed: int
    fits: int
    pick: str

    def __call__(self, name: str, program: Program) -> HeldOut:
        return _held_out(
            name, program, self.loaded, self.pool, self.protocol, self.folds, self.seed, self.fits, pick=self.pick
        )

    def all(self, named: list[tuple[str, Program]]) -> list[HeldOut]:
        """Every (name, program) scored at once (each fit hands its replays to the engine's pool)."""
        with ThreadPoolExecutor(max(1, len(named))) as threads:
            return list(threads.map(lambda item: self(*item), named))


def _train_view(data_dir: Path, held: set[str], out: Path, loaded: LoadedData) -> Path:
    """A directory of links to the experiments the split trains on: what the search may see."""
    out.mkdir(parents=True, exist_ok=True)
    for e in loaded.experiments:
        if e.name not in held:
            (out / e.name).symlink_to((data_dir / e.name).resolve(), target_is_directory=True)
    return out


def bench_world(
    name: str,
    workdir: Path,
    *,
    size: str,
    generations: int,
    seed: int,
    search_seed: int | None = None,
    search_seeds: int = 1,
    splits=None,
    front_cv: str = SearchConfig.front_cv,
    selection: str = SELECTIONS[0],
    engine: str = ENGINES[0],
    llm: LLMSettings | None = None,
    fits: int = HELD_OUT_FITS,
    pick: str = PICKS[0],
    modulate: float = SearchConfig.modulate,
    switch: float = SearchConfig.switch,
    residual: float = SearchConfig.residual,
    residual_refit: str = SearchConfig.residual_refit,
    time_components: str = SearchConfig.time_components,
    unexercised: str = SearchConfig.unexercised,
    physics: str = SearchConfig.physics,
    baselines: str = BASELINES[0],
    seed_starts: int = SearchConfig.seed_starts,
    archive_top: int = 0,
    say: Say = quiet,
) -> list[SplitResult]:
    """selection "validation": the winner is the default deployment rule's pick of a run whose end
    cross-validates its front with `front_cv` (INNER_FRONT_CV: the split's inner groups); "inner": the
    search runs `--cv groups:split-<name>.inner.yaml` (the split's kind of extrapolation inside
    its train configurations) without a front CV, so the winner is the lowest such CV loss.
    search_seeds: each split searched with seeds S, S + 1, ... (S: search_seed, else seed), one
    result each. archive_top > 0: each split's result also holds the best held out of the archive's
    top programs (`_with_archive_best`), added to a result finished before without it."""
    world = load_world(name)
    chosen = [s for s in SPLITS if splits is None or s.name in splits]
    base = seed if search_seed is None else search_seed
    results = []
    for grid in GRIDS:
        in_grid = [s for s in chosen if s.grid == grid]
        if not in_grid:
            continue
        data_dir = workdir / world.name / ("data" if grid == GRIDS[0] else f"data-{grid}")
        split_files = _world_data(world, data_dir, seed, size, say, grid)
        loaded = load_data(data_dir)
        if loaded.errors:
            raise UserError(f"world {world.name}: {loaded.errors[0]}")
        with ReplayPool(loaded.experiments) as pool:
            for split in in_grid:
                protocol = f"{GROUPS_PREFIX}{split_files[split.name]}"
                folds = make_folds(protocol, loaded.experiments)
                held = {n for f in folds for n in f.held_out}
                score = SplitScorer(loaded, pool, protocol, folds, seed, fits, pick)
                for k in range(search_seeds):
                    at = f"{split.name}" if k == 0 else f"{split.name}-s{base + k}"  # the first: as before seeds
                    result_file = workdir / world.name / f"{at}{RESULT_SUFFIX}"
                    done = SplitResult.from_json(_read_json(result_file)) if result_file.exists() else None
                    if done is not None and done.generations != generations:
                        done = None  # an extended search
                    archive_dir = archive_of(result_file)
                    if done is not None and {r for r, _ in done.rules} != set(RULES) and done.rules:
                        say(f"  {world.name} {split.name}: scoring held out the picks of the rules added since")
                        done = replace(done, rules=_rules_scored(archive_dir, score, dict(done.rules)))
                        _write_json(result_file, done.to_json())
                    if done is not None and (not archive_top or done.archive_best is not None):
                        say(f"  {world.name} {split.name} (search seed {base + k}): done before, kept")
                        results.append(done)
                        continue
                    if done is None:
                        inner = selection == "inner"
                        config = SearchConfig(
                            generations=generations,
                            seed=base + k,
                            cv=inner_protocol(data_dir, split.name) if inner else "none",
                            front_cv="none" if inner else front_cv_protocol(front_cv, data_dir, split.name),
                            modulate=modulate,
                            switch=switch,
                            residual=residual,
                            residual_refit=residual_refit,
                            time_components=time_components,
                            unexercised=unexercised,
                            physics=physics,
                            seed_starts=seed_starts,
                            # the benchmark scores the seeds, the baselines and the law held out itself,
                            # and reads no explanation
                            explain=False,
                            baselines=False,
                        )
                        train_dir = workdir / world.name / f"{split.name}-train"
                        train = train_dir if train_dir.is_dir() else _train_view(data_dir, held, train_dir, loaded)
                        winner, origin, rules = _search(
                            world.name, split.name, train, archive_dir, config, score, engine, llm, say
                        )
                        seeds, baselines_held_out, law = _seeds_and_law(
                            world, split.name, workdir, score, say, baselines, archive_dir, at, base + k
                        )
                        done = SplitResult(
                            world.name,
                            split.name,
                            len(held),
                            tuple(seeds),
                            winner,
                            law,
                            generations,
                            origin,
                            selection,
                            search_seed=base + k,
                            rules=rules,
                            baselines=tuple(baselines_held_out),
                        )
                    if archive_top:
                        say(
                            f"  {world.name} {split.name}: scoring held out the archive's {archive_top} best by each rule"
                        )
                        done = _with_archive_best(done, archive_dir, archive_top, score)
                        best = done.archive_best
                        say(
                            f"  {world.name} {split.name}: best of {done.archive_scored} held out {best.program} "
                            f"{best.loss:.2f}"
                        )
                    _write_json(result_file, done.to_json())
                    results.append(done)
    return results


def inner_protocol(data_dir: Path, split: str) -> str:
    """The split's own kind of extrapolation inside its train configurations: its inner groups file."""
    return f"{GROUPS_PREFIX}{split_file(data_dir, split, inner=True)}"


def front_cv_protocol(front_cv: str, data_dir: Path, split: str) -> str:
    """The protocol a search's end cross-validates its front with (INNER_FRONT_CV: inner_protocol)."""
    return inner_protocol(data_dir, split) if front_cv == INNER_FRONT_CV else front_cv


def _search(
    world: str, split: str, train: Path, archive_dir: Path, config: SearchConfig, score: SplitScorer, engine, llm, say
) -> tuple[HeldOut, str, tuple[tuple[str, HeldOut], ...]]:
    """The search on the split's train configurations (or its continuation), its winner (the
    DEFAULT_RULE's pick) scored held out, what made the winner, and every rule's pick scored held out."""
    resume = (archive_dir / Archive.FILE).exists()
    if resume:
        last = _last_generation(archive_dir)
        if last > config.generations:
            raise UserError(
                f"{archive_dir}: its search is at generation {last}, past --generations {config.generations}; "
                "a resumed benchmark can extend its searches, not shorten them"
            )
        left = f"continues to {config.generations}" if last < config.generations else "nothing to run"
        say(f"  {world} {split}: its search is at generation {last}; {left}")
    run_search(config, EvaluationSetup(data=train), archive_dir, resume=resume, llm=llm, engine=engine)
    with opened(archive_dir) as archive:
        chosen = choose(archive, DEFAULT_RULE).program
    rules = _rules_scored(archive_dir, score)
    winner = dict(rules)[DEFAULT_RULE]
    say(f"  {world} {split}: search winner #{chosen.id} held-out loss {winner.loss:.2f}")
    return winner, f"seed {chosen.operator_detail}" if chosen.operator == "seed" else chosen.operator, rules


def _rules_scored(
    archive_dir: Path, score: SplitScorer, known: dict[str, HeldOut] | None = None
) -> tuple[tuple[str, HeldOut], ...]:
    """Each deployment rule's pick of the archive, scored held out (a program once, whichever rules
    pick it; the picks of `known` rules, scored before, are kept as they are)."""
    known = known or {}
    with opened(archive_dir) as archive:
        picks = {rule: choose(archive, rule).program for rule in RULES}
    scored = {h.program: h for h in known.values()}
    todo = {f"#{p.id}": p for rule, p in picks.items() if rule not in known and f"#{p.id}" not in scored}
    scored |= dict(zip(todo, score.all([(n, parse_program(p.source)) for n, p in todo.items()])))
    return tuple((rule, known.get(rule) or scored[f"#{p.id}"]) for rule, p in picks.items())


def _with_archive_best(result: SplitResult, archive_dir: Path, top: int, score: SplitScorer) -> SplitResult:
    """The result with the lowest held-out loss among its winner and the archive's `top` programs of
    lowest CV loss and `top` of lowest train loss, each scored as the winner was: does the archive
    hold what generalizes, and the selection rule did not pick it, or does it not hold it at all?"""
    with opened(archive_dir) as archive:
        run, programs = run_programs(archive)
        cv = cv_by_program(archive, run.id)
    fitted = [
        p for p in programs if p.stage in ("seed", "full") and p.train_loss is not None and math.isfinite(p.train_loss)
    ]
    cv_loss = {  # a program's lowest loss over the protocols it was cross-validated with
        pid: min(losses) for pid, by in cv.items() if (losses := [s.loss for s in by.values() if s.loss is not None])
    }
    by_cv = sorted((p for p in fitted if p.id in cv_loss), key=lambda p: (cv_loss[p.id], p.id))[:top]
    by_train = sorted(fitted, key=lambda p: (p.train_loss, p.id))[:top]
    winner = result.winner.program
    chosen = {f"#{p.id}": p for p in [*by_cv, *by_train] if f"#{p.id}" != winner}
    scored = [result.winner, *score.all([(name, parse_program(p.source)) for name, p in chosen.items()])]
    best = min(scored, key=lambda h: (math.isnan(h.loss), h.loss))  # the winner on a tie: it comes first
    return replace(result, archive_best=best, archive_scored=len(scored))


def _world_data(world, data_dir: Path, seed: int, size: str, say: Say, grid: str = GRIDS[0]) -> dict[str, Path]:
    """The world's experiments of `grid` and its split files: those in data_dir when a generation of
    the same world, seed, size and grid finished there (its world.json is written last), else
    generated anew (over what a killed generation left)."""
    meta = world_identity(world, seed, size, grid)
    done = data_dir / WORLD_FILE
    if done.exists():
        found = _read_json(done)
        if {k: found.get(k) for k in meta} != meta:
            raise UserError(
                f"{done}: holds {found.get('world')} seed {found.get('seed')} {found.get('size')}, not {world.name} seed {seed} {size}"
            )
        say(f"world {world.name}: its {size} {grid} grid, generated before, in {data_dir}")
        return {s.name: split_file(data_dir, s.name) for s in grid_splits(grid)}
    if data_dir.exists():
        shutil.rmtree(data_dir)  # a generation killed before its world.json: the benchmark's own files
    say(f"world {world.name}: generating its {size} {grid} grid into {data_dir}")
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    return write_world(world, data_dir, seed=seed, size=size, grid=grid)[1]


def _seeds_and_law(
    world,
    split: str,
    workdir: Path,
    score: SplitScorer,
    say,
    baselines: str = BASELINES[0],
    archive_dir: Path | None = None,
    at: str | None = None,
    search_seed: int = 0,
) -> tuple[list[HeldOut], list[HeldOut], HeldOut]:
    """Every seed's, every shipped baseline's (BLIS's blackbox) and the law's held-out scores on the
    split. "as-searched": each seed as the search fitted it in its generation 0 (a seed the search
    refused, from its file), each baseline from its file, and the law as such a fit takes it from
    its truth, kept in <at>-baselines.json per search; "from-files": every seed and baseline from
    its file and the law from its truth, once per split (<split>-baselines.json)."""
    searched = baselines == BASELINES[0] and archive_dir is not None
    keep = workdir / world.name / f"{at if searched and at else split}-baselines.json"
    if keep.exists():
        scored = [_held_out_of(d) for d in _read_json(keep)]
    else:
        fitted = _generation_zero(archive_dir) if searched else {}
        programs = [(p.stem, fitted.get(p.stem) or parse_program(p.read_text())) for p in seed_paths()]
        programs += [(p.stem, parse_program(p.read_text())) for p in baseline_paths()]
        law = _as_a_seed(world.program, score, search_seed) if searched else world.program
        scored = score.all(programs + [("law", law)])
        _write_json(keep, [asdict(s) for s in scored])
    for s in scored:
        say(f"  {world.name} {split}: {s.program} held-out loss {s.loss:.2f}")
    baselines = {p.stem for p in baseline_paths()}  # kept files of older benchmarks hold blackbox among the seeds
    seeds = [s for s in scored[:-1] if s.program not in baselines]
    return seeds, [s for s in scored[:-1] if s.program in baselines], scored[-1]


def _as_a_seed(program: Program, score: SplitScorer, seed: int) -> Program:
    """The program fitted on the split's train configurations as a search fits a seed in its
    generation 0 (the standard fit from its own constants)."""
    held = {n for f in score.folds for n in f.held_out}
    train = [e for e in score.loaded.experiments if e.name not in held]
    result = fit_constants(program, train, score.pool, FitConfig(seed=seed))
    return program.with_constants(result.constants["all"])


def _generation_zero(archive_dir: Path) -> dict[str, Program]:
    """The seeds as a search fitted them (name -> program with its fitted constants)."""
    with opened(archive_dir) as archive:
        _, programs = run_programs(archive)
    return {p.operator_detail: parse_program(p.source) for p in programs if p.operator == "seed" and p.generation == 0}


def _last_generation(archive_dir: Path) -> int:
    with opened(archive_dir) as archive:
        run = archive.run()
        return archive.last_generation(run.id) if run else -1


def bench_worlds(
    out_dir: Path,
    *,
    worlds: list[str] | None = None,
    quick: bool = False,
    size: str | None = None,
    generations: int | None = None,
    splits: list[str] | None = None,
    seed: int = 0,
    search_seed: int | None = None,
    search_seeds: int | None = None,
    selection: str = SELECTIONS[0],
    front_cv: str | None = None,
    engine: str = ENGINES[0],
    llm: LLMSettings | None = None,
    fits: int | None = None,
    pick: str = PICKS[0],
    modulate: float = SearchConfig.modulate,
    switch: float = SearchConfig.switch,
    residual: float = SearchConfig.residual,
    residual_refit: str = SearchConfig.residual_refit,
    time_components: str | None = None,
    unexercised: str | None = None,
    physics: str = SearchConfig.physics,
    archive_top: int = 0,
    resume: bool = False,
    say: Say = quiet,
) -> list[SplitResult]:
    """Every world (quick: QUICK_WORLDS on the small grid, the by-gpu split, QUICK_GENERATIONS, one
    search seed, each seed program fitted from one start in generation 0, one held-out fit of each
    program and no CV of the search's front, so the winner is its best validation loss) into
    out_dir: per world its data, split files, and per split and search seed (search_seeds of them,
    default DEFAULT_SEARCH_SEEDS) one search archive and one result. resume: continue the
    benchmark in out_dir, which must have been started with the same settings but --generations
    and --search-seeds."""
    search_seeds = search_seeds or (1 if quick else DEFAULT_SEARCH_SEEDS)
    fits = fits or (1 if quick else HELD_OUT_FITS)
    if search_seeds < 1:
        raise UserError(f"--search-seeds must be 1 or more, not {search_seeds}")
    names = list(worlds or (QUICK_WORLDS if quick else world_names()))
    check_engine(engine, llm)
    time_components = engine_rule(engine, "time_components", time_components)
    unexercised = engine_rule(engine, "unexercised", unexercised)
    if archive_top < 0:
        raise UserError(f"--archive-top must be 0 or more, not {archive_top}")
    if pick not in PICKS:
        raise UserError(f"--held-out-pick must be one of {', '.join(PICKS)}, not {pick!r}")
    if selection not in SELECTIONS:
        raise UserError(f"--select must be one of {', '.join(SELECTIONS)}, not {selection!r}")
    front_cv = front_cv or ("none" if quick else SearchConfig.front_cv)
    if front_cv not in FRONT_CVS:
        raise UserError(f"--front-cv must be one of {', '.join(FRONT_CVS)}, not {front_cv!r}")
    for n in names:
        load_world(n)  # an unknown name or a bad law fails before anything is written
    known = [s.name for s in SPLITS]
    for name in splits or ():
        if name not in known:
            raise UserError(f"--split: unknown split {name!r} (the splits are {', '.join(known)})")
    settings = {
        "worlds": names,
        "size": size or ("small" if quick else "full"),
        "splits": [n for n in known if n in splits] if splits else list(QUICK_SPLITS) if quick else known,
        "seed": seed,
        "search_seed": search_seed,  # None: --seed
        "select": selection,
        "engine": engine,
        "llm": llm.model if llm else None,
        "held_out_fits": fits,
        "held_out_pick": pick if fits > 1 else None,  # one fit is every rule's pick
        "front_cv": front_cv,
        "modulate": modulate,
        "switch": switch,
        "residual": residual,
        "residual_refit": residual_refit,
        "time_components": time_components,
        "unexercised": unexercised,
        "physics": physics,
        "baselines": BASELINES[0],
        "seed_starts": 1 if quick else SearchConfig.seed_starts,
    }
    out_dir = Path(out_dir)
    if resume:
        _check_resumable(out_dir, settings)
    else:
        check_output_dir(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        _write_json(out_dir / SETTINGS_FILE, settings)
    gens = generations if generations is not None else (QUICK_GENERATIONS if quick else SearchConfig.generations)
    results = []
    for n in names:
        results += bench_world(
            n,
            out_dir,
            size=settings["size"],
            generations=gens,
            seed=seed,
            search_seed=search_seed,
            search_seeds=search_seeds,
            splits=settings["splits"],
            front_cv=front_cv,
            selection=selection,
            engine=engine,
            llm=llm,
            fits=fits,
            pick=pick,
            modulate=modulate,
            switch=switch,
            residual=residual,
            residual_refit=residual_refit,
            time_components=time_components,
            unexercised=unexercised,
            physics=physics,
            baselines=started(out_dir, "baselines"),
            seed_starts=started(out_dir, "seed_starts"),
            archive_top=archive_top,
            say=say,
        )
    return results


# settings added after benchmarks were first stored: one stored without them ran with these
LEGACY_SETTINGS = {
    "modulate": 0.0,
    "switch": 0.0,
    "residual": 0.0,
    "residual_refit": "never",
    "time_components": "free",
    "search_seed": None,
    "unexercised": "allow",
    "physics": "off",
    "baselines": BASELINES[1],
    "seed_starts": SearchConfig.seed_starts,  # the default since seeds were fitted from several starts
}


# settings no option sets (--quick sets seed_starts): a resumed benchmark keeps the ones it started with
FIXED_AT_START = ("baselines", "seed_starts")


def started(out_dir: Path, key: str):
    """The stored setting `key` (one of FIXED_AT_START) of the benchmark in out_dir."""
    return {**LEGACY_SETTINGS, **_read_json(out_dir / SETTINGS_FILE)}[key]


def _check_resumable(out_dir: Path, settings: dict) -> None:
    """out_dir holds a benchmark started with these settings (--generations may differ)."""
    keep = out_dir / SETTINGS_FILE
    if not keep.is_file():
        raise UserError(f"{out_dir}: no {SETTINGS_FILE}, so not a worlds benchmark to resume; run without --resume")
    started = {**LEGACY_SETTINGS, **_read_json(keep)}
    started.setdefault("held_out_pick", "median" if started.get("held_out_fits", 1) > 1 else None)
    for key, value in settings.items():
        if key not in FIXED_AT_START and started.get(key) != value:
            raise UserError(
                f"{out_dir}: the benchmark started with {key} {started.get(key)!r}, not {value!r}; "
                "resume it with the same settings (only --generations may change)"
            )
