"""Deployment rules held out, on a finished worlds benchmark (`evolve bench --worlds --out DIR`).

For every result of the benchmark (a world, a split, a search seed) this picks the program each
deployment rule of evolve/deploy/rules.py would emit from that search's archive today (and
`tethered` at several factors, `guarded` at several margins, and, as the reference without a search, the seed with the lowest
validation loss), scores every pick the result has not scored yet held out, exactly as the
benchmark scores its winner (`evolve cv --protocol groups:split-NAME.yaml`: fitted on the train
configurations, all requests of the held-out ones replayed), and prints per rule how often its pick
beats or loses to the best fitted seed held out and to the seed it descends from (the guide's test:
a winner worse than its own seed outside the training data is a defect), and the geometric means
of the ratios. The scores are cached in DIR/selection-sweep.json, so a rerun only scores what is new.

    python tools/selection_sweep.py --out bench-worlds [--factors 1.25,1.5,2] [--margins 10,15,25,30]
        [--protocols lomo,inner] [--json]

--protocols: also `best` and `guarded` (at each margin) ranked by each of these CV protocols ("inner": the split's own question
inside its train configurations, split-NAME.inner.yaml, as `bench --worlds --front-cv inner` ends them), the
front members and seeds each protocol has not scored cross-validated into the archive first, as a
run's end scores them (its fit settings, seed and promoted-fit budget). Once an archive holds
scores of two protocols, every `guarded` pick asks both (a child must beat its seed under each
protocol both are scored under), whichever one ranks; "guarded (one question)" asks the ranking
protocol alone, as `guarded` did before a search's end asked its pick `--guard-cv`'s question too.

docs/results/physics.md ("Which program a search should deploy") cites it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from stepml_evolve.archive.access import opened, run_programs
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.datasets import load_data
from stepml_evolve.evaluator.dsl import parse_program
from stepml_evolve.evaluator.fit.crossval import GROUPS_PREFIX, make_folds
from stepml_evolve.evaluator.known_truth.splits import SPLITS, split_file
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.commands.bench_worlds import SplitScorer, front_cv_protocol
from stepml_evolve.evolve.commands.bench_worlds_results import archive_of, stored_results
from stepml_evolve.evolve.deploy.front_cv import cross_validate_front, run_fit_settings
from stepml_evolve.evolve.deploy.rules import RULES, best_seed, choose, own_seed
from stepml_evolve.evolve.search import RunSettings

CACHE = "selection-sweep.json"
SEED_BY_VALIDATION = "seed by validation"  # the reference without a search


def _front_scored(archive_dir: Path, train_dir: Path, protocol: str) -> None:
    """The search's front and seeds cross-validated under `protocol` as its end would have (the
    scores stored in its archive)."""
    loaded = load_data(train_dir)
    archive = Archive(archive_dir)
    try:
        with ReplayPool(loaded.experiments) as pool:
            run = archive.run()
            search = RunSettings.stored(run.config).search
            fit = run_fit_settings(run, seed=search["seed"], max_evals=search["full_fit_evals"])
            cross_validate_front(archive, run.id, loaded, pool, protocol, fit, print)
    finally:
        archive.close()


def sweep(out: Path, factors: list[float], margins: list[float], protocols: list[str] = ()) -> dict:
    cache_path = out / CACHE
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    rows = []
    for path, result in stored_results(out):
        split = next(s for s in SPLITS if s.name == result.split)
        data_dir = out / result.world / ("data" if split.grid == "standard" else f"data-{split.grid}")
        by_protocol = {name: front_cv_protocol(name, data_dir, split.name) for name in protocols}
        for protocol in by_protocol.values():
            _front_scored(archive_of(path), out / result.world / f"{split.name}-train", protocol)
        with opened(archive_of(path)) as archive:
            picks = {rule: choose(archive, rule).program for rule in RULES}
            picks |= {f"tethered {f:g}": choose(archive, "tethered", (f - 1) * 100).program for f in factors}
            picks |= {f"guarded {m:g}%": choose(archive, "guarded", m).program for m in margins}
            picks["guarded (e2e)"] = choose(archive, "guarded", judge="e2e").program
            # the ranking protocol's question alone, as before the run's end asked --guard-cv's too
            picks["guarded (one question)"] = choose(archive, "guarded", others=False).program
            for n, p in by_protocol.items():  # guarded and best ranked by each protocol, guarded at each margin
                picks[f"best ({n})"] = choose(archive, "best", protocol=p).program
                picks[f"guarded ({n})"] = choose(archive, "guarded", protocol=p).program
                picks[f"guarded ({n}, e2e)"] = choose(archive, "guarded", protocol=p, judge="e2e").program
                picks |= {f"guarded {m:g}% ({n})": choose(archive, "guarded", m, protocol=p).program for m in margins}
            programs = run_programs(archive)[1]
            by_id = {p.id: p for p in programs}
            seed_of = {rule: own_seed(p, by_id).operator_detail for rule, p in picks.items()}
            # no search at all: the seed a user would deploy from generation 0 (the lowest validation loss)
            by_validation = best_seed(programs).operator_detail
        key = str(path.relative_to(out))
        scored = cache.setdefault(key, {})
        for _rule, held in result.rules:
            scored.setdefault(held.program, held.loss)
        todo = {f"#{p.id}": p for p in picks.values() if f"#{p.id}" not in scored}
        if todo:
            loaded = load_data(data_dir)
            protocol = f"{GROUPS_PREFIX}{split_file(data_dir, split.name)}"
            with ReplayPool(loaded.experiments) as pool:
                scorer = SplitScorer(loaded, pool, protocol, make_folds(protocol, loaded.experiments), 0, 1, "train")
                for name, held in zip(todo, scorer.all([(n, parse_program(p.source)) for n, p in todo.items()])):
                    scored[name] = held.loss
            cache_path.write_text(json.dumps(cache, indent=1) + "\n")
        held_out_best_seed = result.best_seed.loss
        held_seeds = {h.program: h.loss for h in result.seeds}
        rows.append(
            {
                "cell": key,
                "best_seed": held_out_best_seed,
                **{r: scored[f"#{p.id}"] for r, p in picks.items()},
                SEED_BY_VALIDATION: held_seeds[by_validation],
                "own_seed": {r: held_seeds[seed_of[r]] for r in picks}
                | {SEED_BY_VALIDATION: held_seeds[by_validation]},
            }
        )
    summary = {}
    for rule in [k for k in rows[0] if k not in ("cell", "best_seed", "own_seed")] if rows else []:
        ratios = [r[rule] / r["best_seed"] for r in rows]
        to_seed = [r[rule] / r[SEED_BY_VALIDATION] for r in rows]
        to_own = [r[rule] / r["own_seed"][rule] for r in rows]
        summary[rule] = {
            "cells": len(rows),
            "beats_seed": sum(x < 1 for x in ratios),
            "worse_than_seed": sum(x > 1 for x in ratios),
            "geomean_to_seed": math.exp(sum(math.log(x) for x in ratios) / len(ratios)),
            "worst_to_seed": max(ratios),
            "better_than_validation_seed": sum(x < 1 for x in to_seed),
            "worse_than_validation_seed": sum(x > 1 for x in to_seed),
            "geomean_to_validation_seed": math.exp(sum(math.log(x) for x in to_seed) / len(to_seed)),
            "better_than_own_seed": sum(x < 0.9999 for x in to_own),
            "worse_than_own_seed": sum(x > 1.0001 for x in to_own),
            "geomean_to_own_seed": math.exp(sum(math.log(x) for x in to_own) / len(to_own)),
            "worst_to_own_seed": max(to_own),
        }
    return {"cells": rows, "rules": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="The benchmark's directory (evolve bench --worlds --out)."
    )
    parser.add_argument("--factors", default="1.25,1.5,2", help="tethered's factors to try, comma-separated.")
    parser.add_argument("--margins", default="10,15,25,30", help="guarded's margins (%%) to try, comma-separated.")
    parser.add_argument(
        "--protocols", default="", help="CV protocols to rank guarded by, comma-separated (lomo, lowo, inner)."
    )
    parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
    args = parser.parse_args()
    report = sweep(
        args.out,
        [float(x) for x in args.factors.split(",")],
        [float(x) for x in args.margins.split(",")],
        [x for x in args.protocols.split(",") if x],
    )
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for cell in report["cells"]:
        print(cell["cell"], {k: round(v, 2) for k, v in cell.items() if k not in ("cell", "own_seed")})
    print(
        f"{'rule':18s} beats  worse  geomean  worst (pick's held-out loss over the best seed's) | "
        "better  worse  geomean (over the seed by validation's) | better  worse  geomean  worst (over its own seed's)"
    )
    for rule, s in report["rules"].items():
        print(
            f"{rule:18s} {s['beats_seed']:2d}/{s['cells']}  {s['worse_than_seed']:2d}/{s['cells']}  "
            f"{s['geomean_to_seed']:.3f}  {s['worst_to_seed']:.2f} | {s['better_than_validation_seed']:2d}/{s['cells']}  "
            f"{s['worse_than_validation_seed']:2d}/{s['cells']}  {s['geomean_to_validation_seed']:.3f} | "
            f"{s['better_than_own_seed']:2d}/{s['cells']}  {s['worse_than_own_seed']:2d}/{s['cells']}  "
            f"{s['geomean_to_own_seed']:.3f}  {s['worst_to_own_seed']:.2f}"
        )


if __name__ == "__main__":
    main()
