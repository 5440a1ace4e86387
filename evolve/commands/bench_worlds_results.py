"""The worlds benchmark's results (evolve bench --worlds, bench_worlds.py): a program's held-out
scores (`HeldOut`), one split's result for one search seed (`SplitResult`, its diagnosis and its
JSON), and the summary over results."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from stepml_evolve.evaluator.scoring.objectives import DEFAULT

RECOVERY_FACTOR = 1.5
# A winner whose train loss is within this factor of the law's (or below it) fits the configurations
# the search saw as well as the law does: those configurations cannot tell the two apart, so no rule
# that selects by them could have preferred the law (SplitResult.diagnosis)
TRAIN_TIE = 1.1
DIAGNOSES = ("recovered", "unidentified", "not found")
QUICK_WORLDS = ("launch_bound", "cuda_graph_buckets")
QUICK_GENERATIONS = 2
QUICK_SPLITS = ("by-gpu",)
SELECTIONS = ("validation", "inner")  # how a search picks its winner (see bench_world)
# which of a program's --held-out-fits scores it: the fit with the lowest train loss (a multi-start
# fit, what a user keeps), or the median of the fits' held-out losses (the benchmark's first rule)
PICKS = ("train", "median")
SETTINGS_FILE = "bench-worlds.settings.json"  # what a resumed benchmark must match


DIAGNOSES = ("recovered", "unidentified", "not found")


@dataclass(frozen=True)
class HeldOut:
    """A program's held-out scores on one split (APE of the per-experiment means, in %)."""

    program: str
    loss: float  # the objective over the held-out experiments (RMS E2E + RMS TTFT)
    e2e_ape: float  # mean over held-out experiments
    ttft_ape: float
    # with several fits (fit seeds seed, seed + 1, ...): each fit's held-out and train loss; the
    # fields above are the picked fit's (PICKS)
    losses: tuple[float, ...] = ()
    train_losses: tuple[float, ...] = ()
    train_loss: float = math.nan  # the picked fit's loss on the train configurations (NaN: not known)


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
    # --archive-top K: the lowest held-out loss among the winner and the archive's K best by each
    # rule (a diagnostic the held-out data chooses, never a winner), and how many were scored
    archive_best: HeldOut | None = None
    archive_scored: int = 0
    search_seed: int | None = None  # the search's seed (None: stored before several search seeds)
    rules: tuple[tuple[str, HeldOut], ...] = ()  # each deployment rule's pick, scored held out
    baselines: tuple[HeldOut, ...] = ()  # the shipped baselines (BLIS's blackbox), never the best seed

    @property
    def best_seed(self) -> HeldOut:
        return min(self.seeds, key=lambda s: (s.loss, s.program))

    @property
    def beats_seed(self) -> bool:
        return self.winner.loss < self.best_seed.loss

    def recovers(self, scored: HeldOut) -> bool:
        """Within RECOVERY_FACTOR of the law's held-out loss, and better than the best seed held out."""
        return scored.loss <= RECOVERY_FACTOR * self.law.loss and scored.loss < self.best_seed.loss

    @property
    def recovered(self) -> bool:
        return self.recovers(self.winner)

    @property
    def train_ratio(self) -> float:
        """The winner's train loss over the law's (both fitted the same way on the train configurations)."""
        return self.winner.train_loss / self.law.train_loss if self.law.train_loss > 0 else math.nan

    @property
    def diagnosis(self) -> str | None:
        """recovered; unidentified: not recovered, yet the winner fits the train configurations as well
        as the law (within TRAIN_TIE) or better, so they cannot tell the two apart and only a prior or
        other train configurations could; not found: the winner fits them worse than the law, so the
        search never reached what the law explains of them. None: a train loss is not known."""
        if self.recovered:
            return DIAGNOSES[0]
        if math.isnan(self.train_ratio):
            return None
        return DIAGNOSES[1] if self.train_ratio <= TRAIN_TIE else DIAGNOSES[2]

    @property
    def archive_recovers(self) -> bool | None:
        """Whether a program of the archive recovers the law (None: not scored)."""
        return None if self.archive_best is None else self.recovers(self.archive_best)

    def to_json(self) -> dict:
        return {
            **{k: v for k, v in asdict(self).items() if k not in ("seeds", "rules", "baselines")},
            "seeds": [asdict(s) for s in self.seeds],
            "baselines": [asdict(s) for s in self.baselines],
            "rules": {rule: asdict(h) for rule, h in self.rules},
            "best_seed": asdict(self.best_seed),
            "beats_seed": self.beats_seed,
            "recovered": self.recovered,
            "archive_recovers": self.archive_recovers,
            "train_ratio": _json_number(self.train_ratio),
            "diagnosis": self.diagnosis,
        }

    @classmethod
    def from_json(cls, d: dict) -> SplitResult:
        fields = {k: d[k] for k in ("world", "split", "held_out", "generations", "winner_origin", "selection")}
        return cls(
            **fields,
            seeds=tuple(_held_out_of(s) for s in d["seeds"]),
            winner=_held_out_of(d["winner"]),
            law=_held_out_of(d["law"]),
            archive_best=_held_out_of(d["archive_best"]) if d.get("archive_best") else None,
            archive_scored=d.get("archive_scored", 0),
            search_seed=d.get("search_seed"),
            rules=tuple((rule, _held_out_of(h)) for rule, h in (d.get("rules") or {}).items()),
            baselines=tuple(_held_out_of(s) for s in d.get("baselines") or ()),
        )


def _json_number(x: float) -> float | None:
    return None if math.isnan(x) else x


def _held_out_of(d: dict) -> HeldOut:
    losses, train_losses = tuple(d.get("losses", ())), tuple(d.get("train_losses", ()))
    train = d.get("train_loss")
    if train is None and d["loss"] in losses and len(train_losses) == len(losses):
        train = train_losses[losses.index(d["loss"])]  # stored before train_loss: the picked fit's
    return HeldOut(
        d["program"],
        d["loss"],
        d["e2e_ape"],
        d["ttft_ape"],
        losses,
        train_losses,
        math.nan if train is None else train,
    )


RESULT_SUFFIX, ARCHIVE_SUFFIX = "-result.json", "-archive"  # WORLD/SPLIT[-sN]-result.json and its search's archive


def stored_results(out: Path) -> list[tuple[Path, SplitResult]]:
    """Every result a worlds benchmark in `out` stored (its file, the result), in path order."""
    return [
        (path, SplitResult.from_json(json.loads(path.read_text()))) for path in sorted(out.glob(f"*/*{RESULT_SUFFIX}"))
    ]


def archive_of(result_file: Path) -> Path:
    """The archive of the search a stored result scored."""
    return result_file.with_name(result_file.name.removesuffix(RESULT_SUFFIX) + ARCHIVE_SUFFIX)


def worlds_summary(results: list[SplitResult]) -> dict:
    """Per world (over its splits and search seeds): beats the best seed on the mean held-out loss,
    recovered on every split and seed; over every result (a cell: a world, a split, a search seed):
    how often the winner is worse than the best seed held out, and the same for each deployment rule."""
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
            # --archive-top: a program of the archive within 1.5x of the law on every split
            "archive_recovers": all(r.archive_recovers for r in rs)
            if all(r.archive_best is not None for r in rs)
            else None,
        }
        for w, rs in worlds.items()
    }
    rules: dict[str, dict] = {}
    for r in results:
        for rule, h in r.rules:
            cell = rules.setdefault(
                rule, {"cells": 0, "beats_seed": 0, "worse_than_seed": 0, "recovered": 0, "ratios": []}
            )
            cell["cells"] += 1
            cell["beats_seed"] += h.loss < r.best_seed.loss
            cell["worse_than_seed"] += h.loss > r.best_seed.loss
            cell["recovered"] += r.recovers(h)
            if h.loss > 0 and r.best_seed.loss > 0 and math.isfinite(h.loss):
                cell["ratios"].append(math.log(h.loss / r.best_seed.loss))
    for cell in rules.values():
        ratios = cell.pop("ratios")
        cell["geomean_to_seed"] = math.exp(mean(ratios)) if ratios else None
    return {
        "objective": DEFAULT.name,
        "worlds": per_world,
        "beats_seed": sum(v["beats_seed"] for v in per_world.values()),
        "recovered": sum(v["recovered"] for v in per_world.values()),
        "of": len(per_world),
        "cells": len(results),
        "worse_than_seed": sum(r.winner.loss > r.best_seed.loss for r in results),
        # per split: how many were recovered, unidentified by their train configurations, not found
        "diagnoses": {d: sum(r.diagnosis == d for r in results) for d in DIAGNOSES},
        "rules": rules,
    }
