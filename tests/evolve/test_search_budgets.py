"""The fit budgets of a search: a promoted child's full fit runs the trust region the search's
full-fit settings say, a seed's fit the standard one; the trust region stops on judged points."""

from __future__ import annotations

import dataclasses

from stepml_evolve.evaluator.data.experiments import SPLITS
from stepml_evolve.evaluator.dsl import load_program
from stepml_evolve.evaluator.fit.fitting import FitConfig, fit_constants
from stepml_evolve.evaluator.scoring.pool import ReplayPool
from stepml_evolve.evolve.search.cascade import Candidate, Cascade
from stepml_evolve.evolve.search.emitters import Proposal
from stepml_evolve.evolve.search.settings import SearchConfig
from stepml_evolve.seeds import baseline_path, seed_path


def test_a_promoted_child_gets_the_full_fit_trust_region_and_a_seed_the_standard_one(synthetic):
    exps = synthetic.experiments
    program = load_program(seed_path("roofline"))
    config = SearchConfig(
        seed=3, full_fit_evals=5, full_fit_candidates=1, full_fit_surrogate=60, linear="solve", seed_starts=1
    )
    with ReplayPool(exps) as pool:
        cascade = Cascade(synthetic, pool, config)
        cand = Candidate(program, Proposal("seed", [], program.source), None, 0, constants=dict(program.constants))
        (promoted,) = cascade.full_fits([(cand, (1, 2))])
        base = FitConfig(seed=cascade._seed(1, 2, 2), max_evals=5, sigma0=config.full_fit_sigma, objective=cascade.goal)
        asked = fit_constants(
            program,
            exps,
            pool,
            dataclasses.replace(base, candidates=1, surrogate_evals=60, linear_solve=True),
            start=cand.constants,
        )
        standard = fit_constants(program, exps, pool, base, start=cand.constants)
        assert promoted.constants == asked.constants["all"]
        assert asked.constants["all"] != standard.constants["all"]  # the settings change the fit: the test can fail

        (seeded,) = cascade.seed_fits([program])
        seed_base = dataclasses.replace(base, seed=cascade._seed(0, 0), max_evals=None, sigma0=FitConfig.sigma0)
        assert (
            seeded.constants == fit_constants(program, exps, pool, seed_base, start=program.constants).constants["all"]
        )


def test_the_trust_region_stalls_on_judged_points_not_iterations(synthetic):
    """stall_points counts an iteration as its candidates: one candidate per iteration gets three
    iterations where three candidates get one (a tolfun no gain reaches: every iteration stalls)."""
    exps = synthetic.experiments
    program = load_program(seed_path("roofline"))
    config = FitConfig(seed=1, max_evals=40, surrogate_evals=60, tolfun=1e9, stall_points=3)
    with ReplayPool(exps) as pool:
        one = fit_constants(program, exps, pool, dataclasses.replace(config, candidates=1), start=program.constants)
        three = fit_constants(program, exps, pool, dataclasses.replace(config, candidates=3), start=program.constants)
    assert (one.iterations, three.iterations) == (3, 1)
    assert one.loss == three.loss  # neither moved from its start


def test_the_runs_linear_setting_reaches_its_screening_and_full_fits(synthetic):
    """--linear solve (the default) and sample give each fit of the cascade the FitConfig a direct
    fit with that linear_solve gives, and the two differ on a program with affine constants."""
    exps = synthetic.experiments
    program = load_program(baseline_path("blackbox"))  # affine in all six constants
    fits = {}
    with ReplayPool(exps) as pool:
        for mode in ("solve", "sample"):
            cascade = Cascade(synthetic, pool, SearchConfig(seed=3, full_fit_evals=4, linear=mode))
            assert cascade.quick.linear_solve is (mode == "solve")
            cand = Candidate(program, Proposal("seed", [], program.source), None, 0)
            cascade.screen([(cand, (1, 0))])
            (full,) = cascade.full_fits([(cand, (1, 0))])
            direct = fit_constants(
                program,
                exps,
                pool,
                FitConfig(
                    seed=cascade._seed(1, 0, 2),
                    max_evals=4,
                    sigma0=SearchConfig.full_fit_sigma,
                    objective=cascade.goal,
                    candidates=1,
                    surrogate_evals=SearchConfig.full_fit_surrogate,
                    linear_solve=mode == "solve",
                ),
                start=cand.constants,
            )
            assert full.constants == direct.constants["all"]
            fits[mode] = (cand.constants, full.constants)
    assert fits["solve"][0] != fits["sample"][0]  # the screening fits differ: the test can fail


def test_screening_fits_search_their_surrogate_with_80_evaluations_unless_told_otherwise(synthetic):
    """The default screening budget (80 surrogate evaluations per trust-region iteration) reaches
    the screening fit, and --quick-surrogate 0 (None) gives the earlier 200 + 40 n, which screens
    the same child to other constants."""
    program = load_program(seed_path("roofline"))
    screened = {}
    with ReplayPool(synthetic.experiments) as pool:
        for budget in (SearchConfig.quick_surrogate, None):
            cascade = Cascade(synthetic, pool, SearchConfig(seed=3, quick_surrogate=budget))
            assert cascade.quick.surrogate_evals == budget
            cand = Candidate(program, Proposal("seed", [], program.source), None, 0)
            cascade.screen([(cand, (1, 0))])
            direct = fit_constants(
                program,
                synthetic.experiments,
                pool,
                dataclasses.replace(cascade.quick, seed=cascade._seed(1, 0, 1)),
                start=program.constants,
            )
            assert cand.constants == direct.constants["all"] and cand.quick_loss == direct.loss
            screened[budget] = cand.constants
    assert SearchConfig.quick_surrogate == 80
    assert screened[80] != screened[None]


def test_screening_replays_the_share_of_requests_quick_window_says(synthetic):
    """--quick-window sets how much of each screening experiment a screening fit replays (the first
    requests), and a shorter window screens the same child to another loss."""
    program = load_program(seed_path("roofline"))
    losses = {}
    with ReplayPool(synthetic.experiments) as pool:
        for window in (SearchConfig.quick_window, 0.15):
            cascade = Cascade(synthetic, pool, SearchConfig(seed=3, quick_window=window))
            full = {e.name: e for e in synthetic.experiments}
            for e in cascade.screen_exps:
                whole = full[e.name]
                cut = max(1, int(whole.n_requests * window))
                scored = e.split < len(SPLITS)
                assert not scored[cut:].any() and (scored[:cut] == (whole.split[:cut] < len(SPLITS))).all()
            cand = Candidate(program, Proposal("seed", [], program.source), None, 0)
            cascade.screen([(cand, (1, 0))])
            losses[window] = cand.quick_loss
    assert SearchConfig.quick_window == 0.3
    assert losses[0.3] != losses[0.15]


def test_a_promoted_childs_full_fit_is_the_best_of_its_starts(synthetic):
    """--full-fit-starts N: the screening constants and N - 1 prior draws, the best kept (what
    fit_from_starts keeps), so a child is judged by its structure's best fit, not one start's luck."""
    from stepml_evolve.evaluator.fit.starts import fit_from_starts, total

    exps = synthetic.experiments
    program = load_program(seed_path("trained_physics"))
    with ReplayPool(exps) as pool:
        one, three = (
            Cascade(synthetic, pool, SearchConfig(seed=3, full_fit_evals=6, full_fit_starts=n)) for n in (1, 3)
        )
        cand = Candidate(program, Proposal("seed", [], program.source), None, 0, constants=dict(program.constants))
        (single,) = one.full_fits([(cand, (1, 2))])
        (best,) = three.full_fits([(cand, (1, 2))])
        config = three.full_fit_config(three._seed(1, 2, 2), 6, SearchConfig.full_fit_sigma)
        kept, every = fit_from_starts(program, exps, pool, config, cand.constants, 3)
    assert best.constants == kept.constants["all"]
    assert single.constants == every[0].constants["all"]  # one start: the screening constants' fit
    assert len({round(total(r), 9) for r in every}) == 3  # the draws are other fits: the test can fail
    assert total(kept) == min(total(r) for r in every)
    assert three.take_evaluations() > one.take_evaluations()  # every start is counted


def test_a_residual_term_child_is_fitted_from_as_many_starts_as_its_seed(synthetic):
    """A residual_term child adds a structure its seed lacks, its constants where the screening's
    linearization put them: its full fit keeps the best of seed_starts starts, as the seed's did,
    while another operator's child keeps full_fit_starts' one."""
    from stepml_evolve.evaluator.fit.starts import fit_from_starts

    exps = synthetic.experiments
    program = load_program(seed_path("trained_physics"))
    with ReplayPool(exps) as pool:
        cascade = Cascade(synthetic, pool, SearchConfig(seed=3, full_fit_evals=6, full_fit_starts=1, seed_starts=3))
        far = {k: v * 4 if k.startswith("beta") else v for k, v in program.constants.items()}  # a poor start
        aimed, other = (
            Candidate(program, Proposal(op, [1], program.source), None, 0, constants=far)
            for op in ("residual_term", "subtree")
        )
        fits = [cascade.full_fits([(c, (1, 2))])[0] for c in (aimed, other)]
        config = cascade.full_fit_config(cascade._seed(1, 2, 2), 6, SearchConfig.full_fit_sigma)
        kept, every = fit_from_starts(program, exps, pool, config, aimed.constants, 3)
    assert fits[0].constants == kept.constants["all"] and fits[1].constants == every[0].constants["all"]
    assert kept is not every[0]  # a draw fitted better than the screening constants: the test can fail
