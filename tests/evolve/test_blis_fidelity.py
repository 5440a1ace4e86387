"""The emitted model inside real BLIS predicts what the tool predicts: three real experiments
exported (`evolve data export --blis-trace`), replayed by `blis replay` with the model installed by
`evolve emit-go --blis`, and compared per request with the tool's replay (BLIS semantics)."""

from __future__ import annotations

import pytest
from conftest import REAL_DATA, needs_real_data

from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evolve.blis.compare import compare_with_blis
from stepml_evolve.evolve.blis.install import install_into_blis
from stepml_evolve.seeds import seed_path

# experiment, requests replayed (None: all)
CASES = [
    ("20260217-155451-llama-2-7b-tp1-codegen", None),  # prefix caching: 11 shared system prompts
    ("20260217-170634-llama-2-7b-tp1-reasoning", None),  # KV binds: thousands of preemptions, overload, timeouts
    ("20260218-120914-mixtral-8x7b-v0-1-tp2-codegen", 3000),  # MoE at TP 2
]


@pytest.fixture(scope="module")
def installed(blis_build, tmp_path_factory):
    import shutil

    checkout = tmp_path_factory.mktemp("blis-fidelity") / "blis"
    shutil.copytree(blis_build, checkout, symlinks=True)
    program = seed_path("trained_physics")
    install_into_blis(str(program), None, checkout, go_test=(), say=lambda line: None)
    return checkout, load_program(program)


@needs_real_data
@pytest.mark.parametrize("experiment, requests", CASES, ids=[c[0].split("-", 2)[-1] for c in CASES])
def test_blis_with_the_emitted_model_predicts_what_the_tool_predicts(installed, experiment, requests):
    checkout, program = installed
    f = compare_with_blis(program, REAL_DATA / experiment, checkout, requests=requests)
    assert f.n_compared > 0.04 * (requests or 4800)
    # the tolerances on the means, and in fact every request to the microsecond
    assert abs(f.e2e_diff_pct) < 0.5 and abs(f.ttft_diff_pct) < 1.0, f.to_json()
    assert f.exact_ttft == 1.0 and f.exact_e2e == 1.0, f.to_json()
    assert f.blis_finished == f.tool_finished


def test_blis_compare_installs_the_program_and_reports_per_request_agreement(blis_checkout):
    """`evolve blis-compare` on the synthetic sample (no real data needed): one command installs the
    program and replays both ways; every request agrees to the microsecond."""
    import json

    from typer.testing import CliRunner

    from stepml_evolve.evaluator.datasets import synthetic_dir
    from stepml_evolve.evolve.cli.app import app

    data = synthetic_dir()
    name = sorted(d.name for d in data.iterdir() if d.is_dir())[0]

    def compare(experiment: str, *extra: str):
        args = ["blis-compare", str(seed_path("roofline")), "--blis", str(blis_checkout), "--data", str(data)]
        return CliRunner().invoke(app, [*args, "--experiment", experiment, *extra])

    res = compare(name, "--requests", "400", "--json")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["experiment"] == name and row["n_compared"] > 100
    assert row["exact_e2e"] == 1.0 and row["exact_ttft"] == 1.0 and row["e2e_diff_pct"] == 0.0
    res = compare("no-such-experiment")
    assert res.exit_code == 2 and "no experiment directories named no-such-experiment" in res.stderr
