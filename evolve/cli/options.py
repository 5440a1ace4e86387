"""The options several commands share, each defined once as a typed alias (its default is the
parameter's: `SETUP`'s field for the options that make an `EvaluationSetup`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from stepml_evolve.evaluator.datasets import OUTPUT_LEN_POLICIES
from stepml_evolve.evaluator.errors import UserError
from stepml_evolve.evaluator.fitting import METHODS
from stepml_evolve.evaluator.objectives import OBJECTIVES
from stepml_evolve.evaluator.prompt_reuse import POLICIES as PROMPT_REUSE_POLICIES
from stepml_evolve.evaluator.replay import SEMANTICS
from stepml_evolve.evaluator.soundness import PHYSICS_MODES
from stepml_evolve.evolve.commands import EvaluationSetup

SETUP = EvaluationSetup()
Method = Literal[METHODS]

DataOption = Annotated[
    Path | None,
    typer.Option("--data", help="Directory of replay experiments (default: the built-in synthetic sample)."),
]
OutputLenOption = Annotated[
    Literal[OUTPUT_LEN_POLICIES],
    typer.Option(
        "--output-len", help="Output length policy: profile (server output_len) or reported (client token counts)."
    ),
]
PromptReuseOption = Annotated[
    Literal[PROMPT_REUSE_POLICIES],
    typer.Option(
        "--prompt-reuse",
        help="Which requests sent the same prompt, for the replay's prefix cache: detect (a prompt "
        "list the client cycled through, found in the input lengths, plus shared system "
        "prompts; system prompts only when the lengths show no cycle), system-prompt (only "
        "the system prompts are shared) or off (nothing is).",
    ),
]
SemanticsOption = Annotated[
    Literal[SEMANTICS],
    typer.Option(
        "--semantics",
        help="How the replay accounts a step: blis (as BLIS does, so fitted constants mean the same "
        "in the simulator) or vllm (see docs/concepts/design-notes.md).",
    ),
]
ObjectiveOption = Annotated[
    Literal[OBJECTIVES],
    typer.Option(
        "--objective",
        help="The loss: rms (RMS APE of mean E2E + RMS APE of mean TTFT over experiments) or worst3 "
        "(mean of the three worst experiments' APE of mean E2E).",
    ),
]
WeightsOption = Annotated[
    Path | None,
    typer.Option(
        "--weights",
        help="YAML file of experiment-name pattern -> weight (first match wins, others weigh 1), "
        "e.g. '\"*mixtral*\": 2'.",
    ),
]
PhysicsOption = Annotated[
    Literal[PHYSICS_MODES],
    typer.Option(
        "--physics",
        help="check: refuse a program below the physical floor (the roofline of a step's work at the "
        "hardware's peak, on an envelope of steps users simulate), one that subtracts a time component, "
        "shares a constant between roles, or reads an input that cannot cause its time, and keep fits "
        "at or above the floor; off: neither (a regression such as BLIS's blackbox).",
    ),
]
WorkersOption = Annotated[
    int | None, typer.Option("--workers", min=1, help="Parallel replay threads (default: all cores).")
]
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
SkipBadOption = Annotated[
    bool,
    typer.Option(
        "--skip-bad",
        help="Leave out the experiments that do not load (each said in a 'skipped:' line) instead of "
        "exiting 2: eval scores the good ones first, fit, cv and run stop before any work.",
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
