"""Seed programs, one file each, in the program DSL. Never imported: read as text."""
from importlib import resources
from pathlib import Path


def seed_paths() -> list[Path]:
    """Paths of the shipped seed programs (works from a wheel install too)."""
    root = resources.files(__name__)
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".py") and not p.name.startswith("_"))


def seed_path(name: str) -> Path:
    for p in seed_paths():
        if p.stem == name or p.name == name:
            return p
    raise KeyError(f"no seed named {name!r} (have: {', '.join(p.stem for p in seed_paths())})")
