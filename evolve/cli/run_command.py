"""`evolve run`: the search. Its settings' options are generated from `SearchConfig` and
`EvaluationSetup` (evolve/option_fields.py); the options here are the run's own: where it is
stored, the LLM, the seeds, the engine, the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from stepml_evolve.evolve.commands import EvaluationSetup
from stepml_evolve.evolve.option_fields import from_options
from stepml_evolve.evolve.search import ENGINES, LLMSettings, SearchConfig
from stepml_evolve.evolve.search.settings import MAX_TIMEOUT_S, MIN_TIMEOUT_S

from .console import out, plain, say
from .options import ClusterOption, RemoteWorkersOption, require_with
from .progress import run_progress
from .settings_options import settings_options

LLM_ONLY = ("llm_base_url", "llm_ratio", "llm_timeout", "llm_offline", "budget_usd", "max_llm_calls", "max_llm_tokens")


@settings_options(SearchConfig, EvaluationSetup, skip=("output_len",))
def run_cmd(
    ctx: typer.Context,
    archive_dir: Path | None = typer.Option(
        None, "--archive", help="Archive directory (default: runs/<data>-seed<seed>)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the run in --archive from its last completed generation (a new run if there is none).",
    ),
    llm: str | None = typer.Option(
        None, "--llm", help="litellm model string, e.g. openai/gpt-4o-mini, ollama/qwen2.5-coder."
    ),
    llm_base_url: str | None = typer.Option(
        None, "--llm-base-url", help="OpenAI-compatible server URL (e.g. http://127.0.0.1:8000/v1)."
    ),
    budget_usd: float | None = typer.Option(
        None, "--budget-usd", min=0.0, help="Stop LLM calls once this much is spent."
    ),
    max_llm_calls: int | None = typer.Option(None, "--max-llm-calls", min=0, help="Stop LLM calls after this many."),
    max_llm_tokens: int | None = typer.Option(
        None, "--max-llm-tokens", min=0, help="Stop LLM calls after this many tokens."
    ),
    llm_timeout: float = typer.Option(
        LLMSettings.timeout_s,
        "--llm-timeout",
        min=MIN_TIMEOUT_S,
        max=MAX_TIMEOUT_S,
        help="Seconds before an LLM call is abandoned (then retried).",
    ),
    llm_offline: bool = typer.Option(
        False, "--llm-offline", help="Replay LLM replies from the cache only; never call out."
    ),
    seeds: list[Path] | None = typer.Option(
        None,
        "--seed-programs",
        help="Seed program files, or directories of them, instead of the "
        "shipped seeds/ (repeatable); e.g. a winner saved with `evolve archive show ID --source`.",
    ),
    engine: Literal[ENGINES] = typer.Option(
        ENGINES[0],
        "--engine",
        help="mapelites: our MAP-Elites loop; openevolve: OpenEvolve's controller "
        "(needs --llm) over our evaluator, every program in the same archive.",
    ),
    rewrites: bool = typer.Option(
        False,
        "--rewrites",
        help="With --engine openevolve: ask the LLM for whole programs, not SEARCH/REPLACE "
        "diffs (OpenEvolve's default).",
    ),
    cluster: ClusterOption = None,
    remote_workers: RemoteWorkersOption = None,
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as JSON."),
    settings: dict | None = None,
):
    """Search for step-time programs: MAP-Elites over seeds, symbolic and LLM mutations."""
    from stepml_evolve.evaluator.replay.executor import Cluster
    from stepml_evolve.evolve.commands.run import engine_rule, run_search

    from .tables import dumps, run_summary_tables

    require_with(ctx, "--llm MODEL", llm is not None, *LLM_ONLY)
    setup = from_options(EvaluationSetup, settings, cluster=Cluster.of(cluster, remote_workers))
    config = from_options(
        SearchConfig,
        settings,
        time_components=engine_rule(engine, "time_components", settings["time_components"]),
        unexercised=engine_rule(engine, "unexercised", settings["unexercised"]),
    )
    llm_settings = (
        LLMSettings(
            llm,
            base_url=llm_base_url,
            timeout_s=llm_timeout,
            offline=llm_offline,
            max_calls=max_llm_calls,
            max_tokens=max_llm_tokens,
            max_usd=budget_usd,
        )
        if llm
        else None
    )
    outcome = run_search(
        config,
        setup,
        archive_dir,
        resume=resume,
        seeds=seeds,
        llm=llm_settings,
        engine=engine,
        diffs=not rewrites,
        say=say,
        progress=run_progress,
    )
    if as_json:
        print(dumps(outcome.to_json()))
        return
    for item in run_summary_tables(outcome.summary):
        out.print(item)
    if outcome.summary.get("best"):
        path = plain(str(outcome.archive_dir))  # a newline or an escape in the path is shown escaped, never printed
        out.print(f"archive: {path}  (browse: evolve archive list --archive {path})", highlight=False)
