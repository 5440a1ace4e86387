"""Command-line options generated from settings dataclasses (evolve/option_fields.py).

`@settings_options(SearchConfig, EvaluationSetup, only=...)` adds an option for each flagged
field of the classes (the first class declaring a name wins) to the command's signature, before
its own parameters; the command receives their values as one dict, `settings`, by field name.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal

import typer

from stepml_evolve.evolve.option_fields import OptionField, option_fields


def _option_type(f: OptionField) -> Any:
    t = Literal[f.flag.choices] if f.flag.choices else f.type
    return t | None if (f.flag.unset or f.default is None) and f.flag.choices else t


def _parameter(f: OptionField, name: str) -> inspect.Parameter:
    limits = {k: getattr(f.flag, k) for k in ("min", "max") if getattr(f.flag, k) is not None}
    option = typer.Option(f.decl, help=f.flag.help, show_default=not f.flag.unset, **limits)
    default = None if f.flag.unset else f.default
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[_option_type(f), option]
    )


def settings_options(*classes: type, only: Iterable[str] | None = None, skip: Iterable[str] = ()) -> Callable:
    """The decorator: the flagged fields of `classes` (those named in `only`, if given; not those in
    `skip`) as options, each parameter named as its field."""
    wanted = None if only is None else set(only)
    skip = set(skip)
    fields: dict[str, OptionField] = {}
    for cls in classes:
        for f in option_fields(cls):
            if (wanted is None or f.name in wanted) and f.name not in skip and f.name not in fields:
                fields[f.name] = f

    def decorate(command: Callable) -> Callable:
        own = inspect.signature(command, eval_str=True)
        kept = [p.replace(kind=p.KEYWORD_ONLY) for n, p in own.parameters.items() if n != "settings"]
        generated = [_parameter(f, name) for name, f in fields.items()]

        @functools.wraps(command)
        def wrapper(**kwargs):
            settings = {name: kwargs.pop(name) for name in fields}
            return command(**kwargs, settings=settings)

        signature = own.replace(parameters=[*generated, *kept])  # the settings first in --help
        wrapper.__signature__ = signature
        wrapper.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        del wrapper.__wrapped__  # typer must see this signature, not the command's
        return wrapper

    return decorate


def option_type(cls: type, name: str) -> Any:
    """One flagged field of `cls` as an annotated parameter type (`data: option_type(EvaluationSetup,
    "data") = None`), for a command that takes it by itself."""
    f = next(f for f in option_fields(cls) if f.name == name)
    return _parameter(f, name).annotation
