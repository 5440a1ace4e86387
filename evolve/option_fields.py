"""A setting's command-line face, declared once on its dataclass field.

`setting(default, help, ...)` is a dataclass field that carries its flag, help and limits; the
command line builds its options from these fields (evolve/cli/settings_options.py) and the docs
their option tables (docs/gen_commands.py), so adding a setting touches its field and the code
that uses it. A field declared with plain `field()` or a bare default has no flag.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

KEY = "option"  # the metadata key a field's Flag is stored under


@dataclass(frozen=True)
class Flag:
    help: str
    flag: str | None = None  # default: --name-with-dashes
    choices: tuple[str, ...] | None = None  # the values a str setting may take (a Literal on the command line)
    min: float | None = None
    max: float | None = None
    zero_is_none: bool = False  # the command line gives None as 0 (e.g. "0: 200 + 40 per constant")
    unset: bool = False  # the command line's default is None (the command decides the value); else the field's


def setting(default: Any, help: str, **flag: Any) -> Any:
    """A dataclass field with a command-line flag (see Flag for the keywords)."""
    return dataclasses.field(default=default, metadata={KEY: Flag(help, **flag)})


@dataclass(frozen=True)
class OptionField:
    """A field with a flag, as the command line and the docs see it."""

    name: str
    type: Any  # the field's type, resolved
    default: Any
    flag: Flag

    @property
    def decl(self) -> str:
        """The option as declared: `--name`, or a flag pair `--name/--no-name`."""
        return self.flag.flag or "--" + self.name.replace("_", "-")

    @property
    def opt(self) -> str:
        """The option's name: `--name` (of a pair, the first)."""
        return self.decl.split("/")[0]


def option_fields(cls: type) -> list[OptionField]:
    """The fields of dataclass `cls` that have a flag, in declaration order."""
    return [
        OptionField(f.name, _resolved(f.type, cls), f.default, f.metadata[KEY])
        for f in dataclasses.fields(cls)
        if KEY in f.metadata
    ]


def _resolved(hint: Any, cls: type) -> Any:
    """A field's type, its annotation (a string under `from __future__ import annotations`)
    evaluated in the module of `cls`, as typing.get_type_hints does, but for this field alone: a
    field without a flag may be typed with a name its module imports for type checkers only (one
    that would load the replay with the options)."""
    return eval(hint, vars(sys.modules[cls.__module__])) if isinstance(hint, str) else hint


def from_options(cls: type, values: dict[str, Any], **overrides: Any) -> Any:
    """An instance of `cls` from command-line values (by field name, for its flagged fields;
    zero_is_none applied), its other fields at their defaults, `overrides` last."""
    kwargs = {}
    for f in option_fields(cls):
        if f.name in values and f.name not in overrides:
            value = values[f.name]
            kwargs[f.name] = None if f.flag.zero_is_none and not value else value
    return cls(**kwargs, **overrides)
