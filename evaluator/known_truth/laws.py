"""Finding and checking a world's law: a program file in worlds/ (by name) or anywhere (by path)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from stepml_evolve.evaluator.dsl import Program, parse_program
from stepml_evolve.evaluator.dsl.program import load_program
from stepml_evolve.evaluator.dsl.units import check_units
from stepml_evolve.evaluator.errors import UserError


class WorldError(UserError, ValueError):
    """An unknown world, a law the DSL rejects, a grid or split that cannot be made: one line."""


@dataclass(frozen=True)
class World:
    name: str
    program: Program  # the hidden law; its constants' start values are the truth

    @property
    def summary(self) -> str:
        """The law's docstring up to its first colon: the name of its mechanism."""
        return (self.program.doc or "").split(":")[0].strip()


def _packaged() -> dict[str, str]:
    folder = resources.files("stepml_evolve.worlds")
    return {
        Path(f.name).stem: f.read_text()
        for f in folder.iterdir()
        if f.name.endswith(".py") and not f.name.startswith("_")
    }


def world_names() -> list[str]:
    return sorted(_packaged())


def load_world(name: str) -> World:
    """A packaged world by name, or a law file by path (a name ending in .py or an existing file).
    WorldError, or ProgramError naming the file, when it cannot be a world."""
    packaged = _packaged()
    if name in packaged:
        program, origin = parse_program(packaged[name]), f"world {name}"
    elif name.endswith(".py") or Path(name).exists():
        program, origin = load_program(name), name
        name = Path(name).stem
    else:
        raise WorldError(f"unknown world {name!r} (known: {', '.join(sorted(packaged))}; or give a law file's path)")
    try:
        check_units(program)
    except UserError as e:
        raise WorldError(f"{origin}: {e}") from None
    return World(name, program)
