"""Held-out configuration groups: each split holds out what lies outside the rest, so a law fitted
on the others must extrapolate (a GPU it never saw, larger models, server knobs beyond the
trained range). Written as `evolve cv --protocol groups:FILE` files, one fold per split."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.evaluator.known_truth.configurations import (
    GRIDS,
    HELD_OUT_WORKLOADS,
    TRAIN_WORKLOADS,
    TRAINED_SEQS,
    TRAINED_TOKENS,
    Configuration,
)
from stepml_evolve.evaluator.known_truth.laws import WorldError

LARGE_MODEL_PARAMETERS = 20e9


@dataclass(frozen=True)
class Split:
    name: str
    fold: str  # the held-out fold's name
    held_out: Callable[[Configuration], bool]
    description: str
    # the same kind of extrapolation inside the split's train configurations, for a search that
    # selects by it (--cv groups:split-<name>.inner.yaml): fold name -> held out, given them all
    inner: Callable[[list[Configuration]], dict[str, list[str]]] = lambda trained: {}
    grid: str = GRIDS[0]  # the grid of configurations it splits (grid.configurations)


SPLITS = (
    Split(
        "by-gpu",
        "L40S",
        lambda c: c.hardware == "L40S",
        "train on H100 and A100, predict L40S (PCIe, GDDR6)",
        lambda trained: _by(trained, lambda c: c.hardware),  # leave one trained GPU out
    ),
    Split(
        "by-size",
        "over-20b",
        lambda c: c.parameters > LARGE_MODEL_PARAMETERS,
        "train on models up to 20B parameters, predict the larger ones",
        lambda trained: {  # the largest trained model(s) out
            "largest-trained": [c.name for c in trained if c.parameters == max(t.parameters for t in trained)]
        },
    ),
    Split(
        "by-knobs",
        "outside-knobs",
        lambda c: not c.trained_knobs,
        f"train on max_num_batched_tokens {TRAINED_TOKENS[0]}-{TRAINED_TOKENS[1]} and max_num_seqs "
        f"{TRAINED_SEQS[0]}-{TRAINED_SEQS[1]}, predict settings outside both",
        lambda trained: {"edge-knobs": [c.name for c in trained if _at_edge(c)]},  # the trained range's ends out
    ),
    Split(
        "by-workload",
        "long-prompts",
        lambda c: c.workload in HELD_OUT_WORKLOADS,
        f"train on resent prompt lists with fixed output lengths ({', '.join(TRAIN_WORKLOADS)}), predict long "
        f"prompts computed in full or behind one shared prefix, outputs of every length ({', '.join(HELD_OUT_WORKLOADS)})",
        lambda trained: {TRAIN_WORKLOADS[-1]: [c.name for c in trained if c.workload == TRAIN_WORKLOADS[-1]]},
        grid="workloads",
    ),
)


def _by(configs: list[Configuration], key: Callable[[Configuration], str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in configs:
        out.setdefault(key(c), []).append(c.name)
    return out


def _at_edge(c: Configuration) -> bool:
    return c.max_num_batched_tokens in TRAINED_TOKENS or c.max_num_seqs in TRAINED_SEQS


def split_file(directory: Path, split: str, inner: bool = False) -> Path:
    """Where a world's groups file for `split` is (its inner twin with `inner`)."""
    return directory / f"split-{split}{'.inner' if inner else ''}.yaml"


def _check_fold(held: list[str], among: list[Configuration], what: str, why: str = "") -> None:
    """A fold must hold out something and leave something: else a WorldError saying `what` did."""
    if not held or len(held) == len(among):
        raise WorldError(
            f"{what} holds out {'no configuration' if not held else 'every configuration'}{why}; use a larger grid"
        )


def grid_splits(grid: str) -> list[Split]:
    return [s for s in SPLITS if s.grid == grid]


def make_splits(configs: list[Configuration], grid: str = GRIDS[0]) -> dict[str, dict[str, list[str]]]:
    """split name -> {fold: held-out experiment names} for the splits of `grid`; WorldError when a
    split would hold out nothing or everything (a grid too small to test it)."""
    out = {}
    for s in grid_splits(grid):
        held = [c.name for c in configs if s.held_out(c)]
        _check_fold(held, configs, f"split {s.name}: the grid", f" ({s.description})")
        out[s.name] = {s.fold: held}
    return out


def make_inner_splits(configs: list[Configuration], grid: str = GRIDS[0]) -> dict[str, dict[str, list[str]]]:
    """split name -> the folds of the same extrapolation inside its train configurations (see
    Split.inner) for the splits of `grid`; WorldError when a fold would hold out nothing or every one."""
    out = {}
    for s in grid_splits(grid):
        trained = [c for c in configs if not s.held_out(c)]
        folds = s.inner(trained)
        for fold, held in folds.items():
            _check_fold(held, trained, f"split {s.name}: its inner fold {fold}")
        out[s.name] = folds
    return out
