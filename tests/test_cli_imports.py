"""The command line answers at once (issue 63): importing it, the help of every command and an
argument error load none of the numeric stack; a command imports its backend, and with it numba,
pycma, scipy and the replay, only when it runs. Each check runs in a fresh interpreter, since this
one has imported everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# what a command's backend brings, and the project's modules that bring it
HEAVY = (
    "cma",
    "scipy",
    "numba",
    "pandas",
    "numexpr",
    "litellm",
    "deap",
    "jinja2",
    "ray",
    "openevolve",
    "stepml_evolve.evaluator.replay",
    "stepml_evolve.evaluator.fit.fitting",
    "stepml_evolve.archive.access",
    "stepml_evolve.evolve.browse.listing",
    "stepml_evolve.evolve.deploy.rules",
    "stepml_evolve.archive.store",
    "stepml_evolve.evolve.search.loop",
)

HELP_OF_EVERY_COMMAND = """
import json, sys
import typer
from typer.testing import CliRunner
from stepml_evolve.evolve.cli import app

def paths(command, path=()):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from paths(sub, (*path, name))

runner = CliRunner()
command = typer.main.get_command(app)
helps = {" ".join(p): runner.invoke(app, [*p, "--help"], prog_name="evolve") for p in paths(command)}
print(json.dumps({"help": {p: [r.exit_code, r.stdout] for p, r in helps.items()}, "modules": sorted(sys.modules)}))
"""

# `evolve ARGS` as the installed command runs it: what it prints goes to stderr, its exit code and
# the modules it loaded to stdout
COMMAND = """
import json, sys
from stepml_evolve.evolve.cli import main
sys.argv = ["evolve", *json.loads(sys.argv[1])]
try:
    main()
    code = 0
except SystemExit as e:
    code = e.code
print(json.dumps({"exit": code, "modules": sorted(sys.modules)}))
"""


def fresh(code: str, *args: str) -> tuple[dict, str]:
    """The JSON a fresh interpreter prints running `code`, and its stderr."""
    env = {**os.environ, "COLUMNS": "200"}  # typer's error box on one line per message
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.stdout, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def heavy(modules: list[str]) -> list[str]:
    """The entries of HEAVY that `modules` holds (a package, or a module of it)."""
    return [h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules)]


def test_the_help_of_every_command_loads_no_backend():
    shown, _ = fresh(HELP_OF_EVERY_COMMAND)
    helps = shown["help"]
    assert {"", "eval", "run", "archive", "archive list", "data synth", "bench"} <= set(helps)
    for path, (code, text) in helps.items():
        assert code == 0 and f"Usage: evolve {path}".strip() in text, (path, text)
    assert heavy(shown["modules"]) == []


def test_a_missing_program_file_is_one_line_and_exit_2_without_the_replay():
    shown, stderr = fresh(COMMAND, json.dumps(["eval", "/no/such/file.py"]))
    assert shown["exit"] == 2
    assert stderr == "error: /no/such/file.py: cannot read program: no such file [file]\n"
    assert heavy(shown["modules"]) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["archive", "list", "--sort", "nope"], "Invalid value for '--sort'"),
        (["eval"], "Missing argument 'program'"),
    ],
)
def test_a_usage_error_is_exit_2_without_the_backend(args, message):
    shown, stderr = fresh(COMMAND, json.dumps(args))
    assert shown["exit"] == 2 and message in stderr, stderr
    assert heavy(shown["modules"]) == []
