"""`evolve bench --worlds`: does the search find laws that generalize? Per known-truth world
(evaluator/worlds) and held-out split, the held-out error of every seed fitted on the train
configurations, of a search's winner (`evolve run` on the train configurations only, its best
program by the default deployment rule), and of the world's own law refitted the same way (the
noise floor). "Recovered": the winner's held-out loss is within RECOVERY_FACTOR of the law's.

Every program is scored the one way `evolve cv --protocol groups:split-<name>.yaml` scores it:
constants fitted on the configurations the split trains on, then all requests of the held-out
ones replayed. The best seed is the one with the lowest held-out loss: the strongest baseline the
seeds offer, chosen with hindsight no user has.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from stepml_evolve.archive.browse import choose
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.crossval import GROUPS_PREFIX, Fold, cross_validate, make_folds
from stepml_evolve.evaluator.datasets import LoadedData, load_data
from stepml_evolve.evaluator.dsl import Program, parse_program
from stepml_evolve.evaluator.engine import Engine
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fitting import FitConfig
from stepml_evolve.evaluator.objectives import DEFAULT
from stepml_evolve.evaluator.outputs import check_output_dir
from stepml_evolve.evaluator.worlds import SPLITS, load_world, world_names, write_world
from stepml_evolve.evaluator.worlds.splits import split_file
from stepml_evolve.evolve.search import SearchConfig
from stepml_evolve.seeds import seed_paths

from .run import ENGINES, LLMSettings, check_engine, run_search
from .setup import EvaluationSetup, Say, quiet

RECOVERY_FACTOR = 1.5
QUICK_WORLDS = ("launch_bound", "cuda_graph_buckets")
QUICK_GENERATIONS = 2
QUICK_SPLITS = ("by-gpu",)
SELECTIONS = ("validation", "inner")  # how a search picks its winner (see bench_world)


@dataclass(frozen=True)
class HeldOut:
    """A program's held-out scores on one split (APE of the per-experiment means, in %)."""

    program: str
    loss: float  # the objective over the held-out experiments (RMS E2E + RMS TTFT)
    e2e_ape: float  # mean over held-out experiments
    ttft_ape: float
    # with several fits (fit seeds seed, seed + 1, ...): each fit's loss; the fields above are the
    # median fit's (the lower middle one of an even count)
    losses: tuple[float, ...] = ()


@dataclass(frozen=True)
class SplitResult:
    world: str
    split: str
    held_out: int  # experiments
    seeds: tuple[HeldOut, ...]
    winner: HeldOut
    law: HeldOut
    generations: int
    winner_origin: str = ""  # "seed NAME" when the search kept a seed, else the operator that made it
    selection: str = SELECTIONS[0]

    @property
    def best_seed(self) -> HeldOut:
        return min(self.seeds, key=lambda s: (s.loss, s.program))

    @property
    def beats_seed(self) -> bool:
        return self.winner.loss < self.best_seed.loss

    @property
    def recovered(self) -> bool:
        return self.winner.loss <= RECOVERY_FACTOR * self.law.loss

    def to_json(self) -> dict:
        return {
            **{k: v for k, v in asdict(self).items() if k not in ("seeds",)},
            "seeds": [asdict(s) for s in self.seeds],
            "best_seed": asdict(self.best_seed),
            "beats_seed": self.beats_seed,
            "recovered": self.recovered,
        }


def _held_out(
    name: str,
    program: Program,
    loaded: LoadedData,
    engine: Engine,
    protocol: str,
    folds: list[Fold],
    seed: int,
    fits: int = 1,
    max_evals: int | None = None,
) -> HeldOut:
    """The program fitted on the split's train configurations `fits` times (fit seeds seed,
    seed + 1, ...) and scored held out: the median fit's scores, with every fit's loss. One fit's
    held-out loss depends on where its optimizer ended (docs/results.md), so a comparison of two
    programs by one fit each is partly a comparison of two fits' luck."""
    scored = []
    for k in range(fits):
        cv = cross_validate(
            program, loaded.experiments, engine, protocol, folds, FitConfig(seed=seed + k, max_evals=max_evals)
        )
        summary = cv.summary()
        scored.append((cv.loss, *(summary.get(m, {}).get("mean", math.inf) for m in ("e2e", "ttft"))))
    ranked = sorted(scored, key=lambda x: (math.isnan(x[0]), x[0]))  # a NaN loss ranks last
    loss, e2e, ttft = ranked[(fits - 1) // 2]  # the median, the lower middle one of an even count
    return HeldOut(name, loss, e2e, ttft, tuple(x[0] for x in scored) if fits > 1 else ())


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
    splits=None,
    front_cv: str = SearchConfig.front_cv,
    selection: str = SELECTIONS[0],
    engine: str = ENGINES[0],
    llm: LLMSettings | None = None,
    fits: int = 1,
    say: Say = quiet,
) -> list[SplitResult]:
    """selection "validation": the winner is `emit-go best` of a run with `front_cv`; "inner": the
    search runs `--cv groups:split-<name>.inner.yaml` (the split's kind of extrapolation inside
    its train configurations) without a front CV, so the winner is the lowest such CV loss."""
    world = load_world(name)
    data_dir = workdir / world.name / "data"
    say(f"world {world.name}: generating its {size} grid into {data_dir}")
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    _, split_files = write_world(world, data_dir, seed=seed, size=size)
    loaded = load_data(data_dir)
    if loaded.errors:
        raise UserError(f"world {world.name}: {loaded.errors[0]}")
    results = []
    with Engine(loaded.experiments) as pool:
        for split in [s for s in SPLITS if splits is None or s.name in splits]:
            protocol = f"{GROUPS_PREFIX}{split_files[split.name]}"
            folds = make_folds(protocol, loaded.experiments)
            held = {n for f in folds for n in f.held_out}
            # the seeds and the law fit at once (each fit hands its replays to the engine's pool)
            programs = [(p.stem, parse_program(p.read_text())) for p in seed_paths()] + [("law", world.program)]
            with ThreadPoolExecutor(len(programs)) as threads:
                jobs = [
                    threads.submit(_held_out, n, prog, loaded, pool, protocol, folds, seed, fits)
                    for n, prog in programs
                ]
                scored = [j.result() for j in jobs]
            seeds, law = scored[:-1], scored[-1]
            for s in scored:
                say(f"  {world.name} {split.name}: {s.program} held-out loss {s.loss:.2f}")
            train = _train_view(data_dir, held, workdir / world.name / f"{split.name}-train", loaded)
            archive_dir = workdir / world.name / f"{split.name}-archive"
            inner = selection == "inner"
            config = SearchConfig(
                generations=generations,
                seed=seed,
                cv=f"{GROUPS_PREFIX}{split_file(data_dir, split.name, inner=True)}" if inner else "none",
                front_cv="none" if inner else front_cv,
            )
            run_search(config, EvaluationSetup(data=train), archive_dir, llm=llm, engine=engine)
            archive = Archive.open(archive_dir)
            try:
                chosen = choose(archive, "best").program
            finally:
                archive.close()
            winner = _held_out(f"#{chosen.id}", parse_program(chosen.source), loaded, pool, protocol, folds, seed, fits)
            say(f"  {world.name} {split.name}: search winner #{chosen.id} held-out loss {winner.loss:.2f}")
            origin = f"seed {chosen.operator_detail}" if chosen.operator == "seed" else chosen.operator
            results.append(
                SplitResult(
                    world.name, split.name, len(held), tuple(seeds), winner, law, generations, origin, selection
                )
            )
    return results


def bench_worlds(
    out_dir: Path,
    *,
    worlds: list[str] | None = None,
    quick: bool = False,
    size: str | None = None,
    generations: int | None = None,
    seed: int = 0,
    selection: str = SELECTIONS[0],
    engine: str = ENGINES[0],
    llm: LLMSettings | None = None,
    fits: int = 1,
    say: Say = quiet,
) -> list[SplitResult]:
    """Every world (quick: QUICK_WORLDS on the small grid, the by-gpu split, QUICK_GENERATIONS and
    no CV of the search's front, so the winner is its best validation loss) into out_dir: per world
    its data, split files, and one search archive per split."""
    names = list(worlds or (QUICK_WORLDS if quick else world_names()))
    check_engine(engine, llm)
    if selection not in SELECTIONS:
        raise UserError(f"--select must be one of {', '.join(SELECTIONS)}, not {selection!r}")
    for n in names:
        load_world(n)  # an unknown name or a bad law fails before anything is written
    check_output_dir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    gens = generations if generations is not None else (QUICK_GENERATIONS if quick else SearchConfig.generations)
    results = []
    for n in names:
        results += bench_world(
            n,
            Path(out_dir),
            size=size or ("small" if quick else "full"),
            generations=gens,
            seed=seed,
            splits=QUICK_SPLITS if quick else None,
            front_cv="none" if quick else SearchConfig.front_cv,
            selection=selection,
            engine=engine,
            llm=llm,
            fits=fits,
            say=say,
        )
    return results


def summary(results: list[SplitResult]) -> dict:
    """Per world (over its splits): beats the best seed on the mean held-out loss, recovered on every split."""
    worlds: dict[str, list[SplitResult]] = {}
    for r in results:
        worlds.setdefault(r.world, []).append(r)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    per_world = {
        w: {
            "winner_loss": mean([r.winner.loss for r in rs]),
            "best_seed_loss": mean([r.best_seed.loss for r in rs]),
            "law_loss": mean([r.law.loss for r in rs]),
            "beats_seed": mean([r.winner.loss for r in rs]) < mean([r.best_seed.loss for r in rs]),
            "recovered": all(r.recovered for r in rs),
        }
        for w, rs in worlds.items()
    }
    return {
        "objective": DEFAULT.name,
        "worlds": per_world,
        "beats_seed": sum(v["beats_seed"] for v in per_world.values()),
        "recovered": sum(v["recovered"] for v in per_world.values()),
        "of": len(per_world),
    }
