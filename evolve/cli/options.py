"""The options several commands share, each defined once as a typed alias: those of an
`EvaluationSetup` or `SearchConfig` field are made from the field (its flag, help and limits; the
default is the parameter's: `SETUP`'s field)."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from stepml_evolve.evaluator.choices import METHODS, PHYSICS_MODES
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evolve.commands import EvaluationSetup
from stepml_evolve.evolve.search import SearchConfig
from stepml_evolve.evolve.search.settings import EMIT_PHYSICS_HELP

from .settings_options import option_type

SETUP = EvaluationSetup()
Method = Literal[METHODS]

DataOption = option_type(EvaluationSetup, "data")
OutputLenOption = option_type(EvaluationSetup, "output_len")
PromptReuseOption = option_type(EvaluationSetup, "prompt_reuse")
WorkersOption = option_type(EvaluationSetup, "workers")
PhysicsOption = option_type(SearchConfig, "physics")
EmitPhysicsOption = Annotated[Literal[PHYSICS_MODES], typer.Option("--physics", help=EMIT_PHYSICS_HELP)]
ClusterOption = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        help="Replay on a Ray cluster instead of local threads: ray://HOST:PORT (its Ray Client server), "
        "HOST:PORT (its GCS, from one of its nodes) or auto (the cluster `ray start --head` runs on "
        "this machine). Needs the extra: pip install '.[ray]'. Same results as threads.",
    ),
]
RemoteWorkersOption = Annotated[
    int | None,
    typer.Option(
        "--remote-workers", min=1, help="With --cluster: replays in flight at once on it (default: the cluster's CPUs)."
    ),
]
MethodOption = Annotated[
    Method,
    typer.Option(
        "--method",
        help="trust-region (trajectory surrogate judged by the closed loop; about a tenth of the replays) "
        "or cmaes (CMA-ES on the closed loop).",
    ),
]


class OptionError(UserError):
    """Options that do not go together: one line naming the flag."""


def given(ctx: typer.Context, *names: str) -> list[str]:
    """The flags of the parameters `names` that the user gave (on the command line or through an
    environment variable), not left at their defaults; as typed, e.g. --llm-base-url."""
    params = {p.name: p for p in ctx.command.params}
    return [
        params[n].opts[0]
        for n in names
        # by name: typer 0.2x vendors its own click, whose ParameterSource is not click's
        if getattr(ctx.get_parameter_source(n), "name", None) in ("COMMANDLINE", "ENVIRONMENT")
    ]


def require_with(ctx: typer.Context, flag: str, present: bool, *names: str) -> None:
    """OptionError naming the first of `names` given by the user when `flag` (which they need) is not."""
    stray = [] if present else given(ctx, *names)
    if stray:
        raise OptionError(f"{', '.join(stray)}: needs {flag} (without it the option would be ignored)")
