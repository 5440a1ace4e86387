"""Seed programs, one file each, in the program DSL (never imported: read as text), the baselines
(baselines/: programs scored beside the seeds, never searched from: BLIS's blackbox regression,
which reads no FLOP or byte time and so no physics holds) and the user's own seeds
(`evolve run --seed-programs`): found, read and validated here."""

import math
from importlib import resources
from pathlib import Path

from stepml_evolve.evaluator.errors import UserError

__all__ = [
    "SeedError",
    "seed_paths",
    "seed_path",
    "baseline_paths",
    "baseline_path",
    "load_seeds",
    "seed_priors",
    "priors_markdown",
]

BASELINES = "baselines"  # the folder of the baselines, beside the seeds


class SeedError(UserError):
    """A seed path or program that cannot start a search: one line naming the file."""


def _programs(root) -> list[Path]:
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".py") and not p.name.startswith("_"))


def seed_paths() -> list[Path]:
    """Paths of the shipped seed programs (works from a wheel install too)."""
    return _programs(resources.files(__name__))


def baseline_paths() -> list[Path]:
    """Paths of the shipped baselines: scored beside the seeds (a run's summary, the worlds'
    table), fitted without the floor, never a parent."""
    return _programs(resources.files(__name__) / BASELINES)


def _named(name: str, paths: list[Path], what: str) -> Path:
    for p in paths:
        if p.stem == name or p.name == name:
            return p
    raise KeyError(f"no {what} named {name!r} (have: {', '.join(p.stem for p in paths)})")


def seed_path(name: str) -> Path:
    return _named(name, seed_paths(), "seed")


def baseline_path(name: str) -> Path:
    return _named(name, baseline_paths(), "baseline")


def load_seeds(paths: list[Path]) -> list[tuple[str, str]]:
    """(name, source) of every seed program under `paths` (files, or directories of *.py files
    not starting with "_"), each parsed and validated; names are the file stems and must be unique."""
    from stepml_evolve.evaluator.dsl import ProgramError, parse_program, read_program_text

    files = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
            if not found:
                raise SeedError(f"{path}: no seed programs (*.py) in this directory")
            files += found
        elif path.exists():  # a file; anything else (a device, a FIFO) is refused when read
            files.append(path)
        else:
            raise SeedError(f"{path}: no such seed program file or directory")
    seeds, seen = [], set()
    for f in files:
        if f.stem in seen:
            raise SeedError(f"{f}: a second seed named {f.stem!r}; seed names (file stems) must be unique")
        seen.add(f.stem)
        try:
            source = read_program_text(f)
            parse_program(source)
        except ProgramError as e:
            raise SeedError(f"{f}: {e}") from None
        seeds.append((f.stem, source))
    return seeds


MAX_SPREAD = 700.0  # a prior's spread, ln units: exp of it (the page's factor) is finite


def _priors_problem(table) -> str | None:
    """What is wrong with a priors table's shape (its field and value), or None."""
    from stepml_evolve.evaluator.errors import cut, shown

    if not isinstance(table, dict) or not isinstance(table.get("quantities"), dict):
        return "expected a mapping with a 'quantities' mapping"
    if not isinstance(table.get("constants"), dict):
        return "expected a 'constants' mapping (seed -> constant -> quantity)"
    for name, q in table["quantities"].items():
        if not isinstance(q, dict):
            return f"quantities.{cut(str(name))} must be a mapping of centre, spread, unit, source, not {shown(q)}"
        for key, positive in (("centre", False), ("spread", True)):
            v = q.get(key)
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not math.isfinite(v)
                or (positive and not 0 < v <= MAX_SPREAD)
            ):
                what = (
                    f"a number above 0 and at most {MAX_SPREAD:g} (the standard deviation of ln(value))"
                    if positive
                    else "a finite number"
                )
                return f"quantities.{cut(str(name))}.{key} must be {what}, not {shown(v)}"
        for key in ("unit", "source"):
            if not isinstance(q.get(key), str):
                return f"quantities.{cut(str(name))}.{key} must be text, not {shown(q.get(key))}"
    for seed, constants in table["constants"].items():
        if not isinstance(constants, dict):
            return f"constants.{cut(str(seed))} must be a mapping of constant -> quantity, not {shown(constants)}"
        for constant, quantity in constants.items():
            if not isinstance(quantity, str) or quantity not in table["quantities"]:
                return f"constants.{cut(str(seed))}.{cut(str(constant))} names {shown(quantity)}, not a quantity of the file"
    return None


def seed_priors(path: str | Path | None = None) -> dict:
    """priors.yaml (or the table at `path`): {"quantities": name -> {centre, spread, unit, source},
    "constants": seed -> constant -> quantity}, the one table of the shipped seeds' priors and
    their sources. Read under the one reader rule; a bad table is a SeedError naming the file
    and the field."""
    from stepml_evolve.evaluator.readers import read_yaml

    path = Path(str(resources.files(__name__) / "priors.yaml")) if path is None else Path(path)
    table = read_yaml(path, SeedError, "priors file")
    problem = _priors_problem(table)
    if problem is not None:
        raise SeedError(f"{path}: {problem}")
    return table


def priors_markdown(path: str | Path | None = None) -> str:
    """The priors table of docs/concepts/priors.md (generated from priors.yaml, or the table at
    `path`, so the page cannot drift); a bad table is a one-line SeedError naming the file."""
    table = seed_priors(path)
    users: dict[str, list[str]] = {}
    for seed, constants in table["constants"].items():
        for constant, quantity in constants.items():
            users.setdefault(quantity, []).append(f"{seed}.{constant}")
    lines = [
        "| quantity | centre | spread (factor) | unit | carried by | source |",
        "|---|---|---|---|---|---|",
    ]
    for name, q in table["quantities"].items():
        factor = f"{q['spread']:g} (x/ {math.exp(q['spread']):.2f})"
        carried = ", ".join(f"`{u}`" for u in users.get(name, []))
        lines.append(f"| {name} | {q['centre']:g} | {factor} | {q['unit']} | {carried} | {q['source']} |")
    return "\n".join(lines) + "\n"
