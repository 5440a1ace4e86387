"""A structure judged by its best fit (issue 64, item 5): a program fitted from several starts
keeps the best, its first start is the plain fit, and a search's seeds are fitted so."""

from __future__ import annotations

import math

import numpy as np
from conftest import tiny_run

from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.fit.config import FitConfig
from stepml_evolve.evaluator.fit.fitting import fit_constants
from stepml_evolve.evaluator.fit.starts import drawn_start, fit_from_starts, total
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.seeds import seed_path


def test_draws_from_the_priors_stay_in_the_bounds_and_differ():
    prog = load_program(seed_path("regime_switch"))
    rng = np.random.default_rng(0)
    draws = [drawn_start(prog, prog.constants, rng) for _ in range(50)]
    for d in draws:
        for k, v in d.items():
            lo, hi = prog.bounds.get(k, (-math.inf, math.inf))
            assert lo <= v <= hi, (k, v)
    assert len({round(d["c_light_compute"], 6) for d in draws}) == 50


def test_the_best_of_several_starts_is_no_worse_than_the_plain_fit_which_is_its_first(synthetic):
    prog = load_program(seed_path("regime_switch"))
    config = FitConfig(seed=4, max_evals=8)
    with ReplayPool(synthetic.experiments) as pool:
        plain = fit_constants(prog, synthetic.experiments, pool, config, start=prog.constants)
        best, every = fit_from_starts(prog, synthetic.experiments, pool, config, prog.constants, starts=3)
    assert len(every) == 3 and every[0].constants == plain.constants and every[0].loss == plain.loss
    assert total(best) == min(total(r) for r in every) and total(best) <= total(plain)
    assert every[1].start != every[0].start and every[2].start != every[1].start


def test_a_search_fits_its_seeds_from_several_starts(tmp_path):
    one = tiny_run(
        tmp_path / "one", 0, "--seed-program-starts", "1", "--seed-programs", str(seed_path("regime_switch"))
    )
    three = tiny_run(
        tmp_path / "three", 0, "--seed-program-starts", "3", "--seed-programs", str(seed_path("regime_switch"))
    )
    assert one.exit_code == 0 and three.exit_code == 0, one.output + three.output

    def seed_fit(d):
        a = Archive(d, read_only=True)
        try:
            run = a.run()
            (p,) = a.programs(run.id)
            return p.train_loss, a.generations(run.id)[0].evaluations
        finally:
            a.close()

    (loss1, evals1), (loss3, evals3) = seed_fit(tmp_path / "one"), seed_fit(tmp_path / "three")
    assert loss3 <= loss1 + 1e-9 and evals3 > evals1


def test_evolve_fit_keeps_the_best_of_its_starts_and_says_each(tmp_path):
    from typer.testing import CliRunner

    from stepml_evolve.evolve.cli.app import app

    out = tmp_path / "rs.fitted.py"
    res = CliRunner().invoke(
        app,
        ["fit", str(seed_path("regime_switch")), "--starts", "2", "--max-evals", "6", "--no-profile"]
        + ["--out", str(out), "--json"],
    )
    assert res.exit_code == 0, res.output
    import json

    found = json.loads(res.output[res.output.index("{") :])
    starts = found["starts"]
    assert len(starts) == 2 and starts[0]["start"] != starts[1]["start"]
    assert found["train_loss"] + sum(found["prior_penalty"].values()) == min(s["loss"] + s["penalty"] for s in starts)
    assert out.exists()
