"""One source per option: the settings fields (evolve/option_fields.py) make `evolve run`'s and
`evolve bench`'s options, the shared options of the replaying commands and the docs' settings page."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import typer
from typer.testing import CliRunner

from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.cli.reference import settings_page
from stepml_evolve.evolve.cli.settings_options import settings_options
from stepml_evolve.evolve.commands import EvaluationSetup
from stepml_evolve.evolve.option_fields import from_options, option_fields, setting
from stepml_evolve.evolve.search import SearchConfig

COMMAND = typer.main.get_command(app)


def _options(*path: str) -> dict:
    command = COMMAND
    for name in path:
        command = command.commands[name]
    return {p.opts[0]: p for p in command.params if p.param_type_name == "option"}


@pytest.mark.parametrize("cls", [SearchConfig, EvaluationSetup])
def test_every_flagged_field_is_an_option_of_run_with_its_default_and_help(cls):
    run = _options("run")
    for f in option_fields(cls):
        if f.name == "output_len":  # a reading policy of eval/fit/cv, not of a search
            assert f.opt not in run
            continue
        option = run[f.opt]
        assert option.help == f.flag.help
        assert option.default == (None if f.flag.unset else f.default)
        if f.flag.choices:
            literal = [a for a in typing.get_args(option.type_descriptor.annotation) if a is not type(None)]
            literal = typing.get_args(literal[0]) if literal and typing.get_origin(literal[0]) else literal
            assert set(literal) == set(f.flag.choices)


def test_the_shared_options_of_the_replaying_commands_come_from_the_same_fields():
    fields = {f.opt: f for f in option_fields(EvaluationSetup)}
    for command in ("eval", "fit", "cv"):
        options = _options(command)
        for flag in ("--data", "--prompt-reuse", "--semantics", "--workers", "--skip-bad"):
            assert options[flag].help == fields[flag].flag.help, (command, flag)


def test_bench_takes_the_search_settings_it_passes_to_every_world_search():
    bench = _options("bench")
    for f in option_fields(SearchConfig):
        if f.name in ("modulate", "switch", "time_components", "unexercised", "physics"):
            assert bench[f.opt].help == f.flag.help


def test_an_option_out_of_range_is_refused_by_the_command_line():
    res = CliRunner().invoke(app, ["run", "--children", "0"])
    assert res.exit_code == 2 and "--children" in res.output


def test_from_options_gives_zero_as_none_and_ignores_other_classes_fields():
    values = {"quick_surrogate": 0, "full_fit_surrogate": 150, "weights": "w.yaml", "children": 3}
    config = from_options(SearchConfig, values)
    assert config.quick_surrogate is None and config.full_fit_surrogate == 150 and config.children == 3
    assert config.weights == ()  # EvaluationSetup's --weights is a file; SearchConfig's weights are not a flag
    assert from_options(SearchConfig, values, children=5).children == 5


def test_a_new_setting_is_an_option_with_nothing_else_written():
    @dataclasses.dataclass(frozen=True)
    class Settings:
        depth: int = setting(3, "How deep.", min=1)
        mode: str = setting("a", "Which mode.", choices=("a", "b"))
        hidden: float = 0.5

    seen = {}

    @settings_options(Settings)
    def command(name: str = typer.Option("x", "--name"), settings: dict | None = None):
        seen.update(settings, name=name)

    cli = typer.Typer()
    cli.command()(command)
    cli.command("other")(lambda: None)
    res = CliRunner().invoke(cli, ["command", "--depth", "4", "--mode", "b", "--name", "y"])
    assert res.exit_code == 0, res.output
    assert seen == {"depth": 4, "mode": "b", "name": "y"}
    assert from_options(Settings, seen) == Settings(depth=4, mode="b")
    res = CliRunner().invoke(cli, ["command", "--mode", "c"])
    assert res.exit_code == 2 and "--mode" in res.output


def test_the_settings_page_lists_every_field_with_its_flag():
    page = settings_page()
    for cls in (SearchConfig, EvaluationSetup):
        section = page.split(f"## `{cls.__name__}`")[1].split("## ")[0]
        flagged = {f.name: f.decl for f in option_fields(cls)}
        for f in dataclasses.fields(cls):
            row = next(line for line in section.splitlines() if line.startswith(f"| `{f.name}` |"))
            assert (f"`{flagged[f.name]}`" if f.name in flagged else "(Python only)") in row
