"""Seed programs, one file each, in the program DSL (never imported: read as text), and the
user's own seeds (`evolve run --seeds`): found, read and validated here."""
import math
from importlib import resources
from pathlib import Path

from stepml_evolve.evaluator.errors import UserError

__all__ = ["SeedError", "seed_paths", "seed_path", "load_seeds", "seed_priors", "priors_markdown"]


class SeedError(UserError):
    """A seed path or program that cannot start a search: one line naming the file."""


def seed_paths() -> list[Path]:
    """Paths of the shipped seed programs (works from a wheel install too)."""
    root = resources.files(__name__)
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".py") and not p.name.startswith("_"))


def seed_path(name: str) -> Path:
    for p in seed_paths():
        if p.stem == name or p.name == name:
            return p
    raise KeyError(f"no seed named {name!r} (have: {', '.join(p.stem for p in seed_paths())})")


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


def seed_priors() -> dict:
    """priors.yaml: {"quantities": name -> {centre, spread, unit, source}, "constants": seed ->
    constant -> quantity}, the one table of the shipped seeds' priors and their sources."""
    import yaml

    return yaml.safe_load((resources.files(__name__) / "priors.yaml").read_text())


def priors_markdown() -> str:
    """The priors table of docs/concepts/priors.md (generated from priors.yaml, so the page cannot drift)."""
    table = seed_priors()
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
