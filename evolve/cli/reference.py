"""The command reference, from the command line itself: one Markdown page per command (its usage,
what it does, a table of its options with their defaults), so the docs site's command pages can
never drift from `evolve COMMAND --help` (docs/gen_commands.py builds them into the site)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path

import typer

from stepml_evolve.evolve.commands import EvaluationSetup
from stepml_evolve.evolve.option_fields import option_fields
from stepml_evolve.evolve.search import SearchConfig

from .app import app


@dataclass(frozen=True)
class CommandPage:
    path: tuple[str, ...]  # ("data", "check") for `evolve data check`
    markdown: str

    @property
    def slug(self) -> str:
        return "-".join(self.path)

    @property
    def name(self) -> str:
        return " ".join(("evolve", *self.path))


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(param) -> str:
    if getattr(param, "is_flag", False) and not param.secondary_opts:
        return ""
    default = param.default
    if default is None or callable(default) or (isinstance(default, (list, tuple)) and not default):
        return ""
    if isinstance(default, bool) and param.secondary_opts:
        return f"`{param.opts[0] if default else param.secondary_opts[0]}`"
    return f"`{default}`"


KINDS = {int: "integer", float: "number", str: "text", Path: "path", bool: "flag"}


def _kind(param) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    annotation = param.type_descriptor.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{c}`" for c in args)
    if args and typing.get_origin(annotation) is not typing.Literal:  # X | None, list[X]
        annotation = args[0]
    return KINDS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _usage(path: tuple[str, ...], command) -> str:
    args = [p.name.upper() for p in command.params if p.param_type_name == "argument"]
    return " ".join(("evolve", *path, *args, "[OPTIONS]"))


def _page(path: tuple[str, ...], command) -> CommandPage:
    lines = [f"# `{' '.join(('evolve', *path))}`", "", "```", _usage(path, command), "```", ""]
    lines += [(command.help or "").strip(), ""]
    params = [p for p in command.params if p.name != "help"]
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name == "option"]
    if arguments:
        lines += ["| argument | meaning |", "|---|---|"]
        lines += [f"| `{a.name.upper()}` | {_cell(getattr(a, 'help', '') or '')} |" for a in arguments]
        lines.append("")
    if options:
        lines += ["| option | takes | default | meaning |", "|---|---|---|---|"]
        for o in options:
            names = " / ".join(f"`{n}`" for n in (*o.opts, *o.secondary_opts))
            lines.append(f"| {names} | {_kind(o)} | {_default(o)} | {_cell(o.help or '')} |")
        lines.append("")
    return CommandPage(path, "\n".join(lines))


def command_pages() -> list[CommandPage]:
    """A page per command and per command group, in the order `evolve --help` lists them."""
    pages: list[CommandPage] = []

    def walk(command, path: tuple[str, ...]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            pages.append(_page(path, command))
            return
        if path:
            listing = [f"# `{' '.join(('evolve', *path))}`", "", (command.help or "").strip(), ""]
            listing += [
                f"- [`evolve {' '.join((*path, name))}`]({'-'.join((*path, name))}.md): "
                f"{_cell((sub.help or '').strip().splitlines()[0] if sub.help else '')}"
                for name, sub in subcommands.items()
            ]
            pages.append(CommandPage(path, "\n".join(listing) + "\n"))
        for name, sub in subcommands.items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return pages


def settings_page() -> str:
    """The settings of a search and of every replaying command, one table per class, from the
    fields themselves (evolve/option_fields.py): the Python name, the flag, the default, the help."""
    lines = [
        "# Settings",
        "",
        "Every setting of a search (`SearchConfig`) and of every replaying command (`EvaluationSetup`),",
        "generated from the fields that declare them: the same field gives the command line its option",
        "and the Python API its keyword. Fields without a flag are set from Python only.",
        "",
    ]
    for cls, where in ((SearchConfig, "`evolve run`"), (EvaluationSetup, "`evolve run`, `eval`, `fit`, `cv`")):
        flagged = {f.name: f for f in option_fields(cls)}
        lines += [f"## `{cls.__name__}`", "", f"Options of {where}.", ""]
        lines += ["| field | option | default | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            o = flagged.get(f.name)
            default = "" if f.default is dataclasses.MISSING else f"`{f.default!r}`"
            flag = f"`{o.decl}`" if o else "(Python only)"
            lines.append(f"| `{f.name}` | {flag} | {default} | {_cell(o.flag.help) if o else ''} |")
        lines.append("")
    return "\n".join(lines)
