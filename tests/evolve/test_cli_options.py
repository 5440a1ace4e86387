"""Option defaults come from the config dataclasses, and `--help` shows them."""

from __future__ import annotations

import dataclasses

import typer
from typer.testing import CliRunner

from stepml_evolve.evaluator.fit.fitting import FitConfig
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.search import SearchConfig

RUN_OPTIONS = {
    "--generations": "generations",
    "--seed": "seed",
    "--children": "children",
    "--quick-evals": "quick_evals",
    "--quick-surrogate": "quick_surrogate",
    "--quick-window": "quick_window",
    "--full-fit-evals": "full_fit_evals",
    "--max-promotions": "max_promotions",
    "--islands": "islands",
    "--migration-interval": "migration_interval",
    "--llm-ratio": "llm_ratio",
    "--semantics": "semantics",
    "--fit-method": "fit_method",
    "--objective": "objective",
    "--patience": "patience",
    "--units": "units",
    "--cv": "cv",
    "--cv-fit-evals": "cv_fit_evals",
    "--front-cv": "front_cv",
    "--guard-cv": "guard_cv",
    "--prompt-reuse": "prompt_reuse",
    "--full-fit-candidates": "full_fit_candidates",
    "--full-fit-surrogate": "full_fit_surrogate",
    "--linear": "linear",
    "--modulate": "modulate",
    "--switch": "switch",
    "--residual": "residual",
    "--residual-refit": "residual_refit",
    "--seed-program-starts": "seed_starts",
    "--full-fit-starts": "full_fit_starts",
    "--explain": "explain",
    "--baselines": "baselines",
    "--physics": "physics",
}
FIT_OPTIONS = {"--seed": "seed", "--scope": "scope", "--restarts": "restarts"}


def _help_rows(command: str) -> dict[str, str]:
    """Each option's row of the help box, its wrapped lines joined."""
    text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout
    rows: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        cell = line.strip("│ ").strip()
        if line.startswith("│ --"):  # an option's first line (wrapped help may also start with "--")
            current = cell.split()[0]
            rows[current] = cell
        elif current and cell:
            rows[current] += " " + cell
    return rows


def _params(command: str) -> dict[str, object]:
    click_command = typer.main.get_command(app).commands[command]
    return {p.opts[0]: p.default for p in click_command.params if p.opts[0].startswith("--")}


def test_run_help_shows_the_search_config_defaults():
    defaults, rows, params = SearchConfig(), _help_rows("run"), _params("run")
    for flag, field in RUN_OPTIONS.items():
        value = getattr(defaults, field)
        assert params[flag] == value, flag
        if value is None:  # a default the method or the data decides: no "[default: None]" shown
            assert "[default:" not in rows[flag], (flag, rows[flag])
        else:  # a flag pair (--explain/--no-explain) shows the flag its default is
            shown = flag.lstrip("-") if value is True else value
            assert f"[default: {shown}]" in rows[flag], (flag, rows[flag])
    # weights: --weights takes a file, the run stores the weights read from it; cv_groups: the
    # folds of --cv groups:FILE, likewise; time_components and unexercised: their defaults depend on --engine
    assert "keep (the default)" in rows["--time-components"] and defaults.time_components == "keep"
    assert "reject (the default)" in rows["--unexercised"] and defaults.unexercised == "reject"
    assert params["--time-components"] is None and params["--unexercised"] is None
    assert set(RUN_OPTIONS.values()) | {
        "time_components",
        "unexercised",
        "seed_fit_evals",
        "promote_margin",
        "sanity_factor",
        "full_fit_sigma",
        "weights",
        "cv_groups",
    } == {f.name for f in dataclasses.fields(SearchConfig)}
    assert params["--seed-program-fit-evals"] == defaults.seed_fit_evals


def test_fit_help_shows_the_fit_config_defaults():
    defaults, rows, params = FitConfig(), _help_rows("fit"), _params("fit")
    for flag, field in FIT_OPTIONS.items():
        assert params[flag] == getattr(defaults, field), flag
        assert f"[default: {getattr(defaults, field)}]" in rows[flag], (flag, rows[flag])
    assert params["--max-evals"] == defaults.max_evals
