"""Generalization inside the search: `evolve run --cv lomo|lowo` makes a promoted child's full fit
the fold fits too (its validation loss is the CV loss, the score stored with it), and every run
ends by cross-validating its Pareto front (`--front-cv`)."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3

import pytest
from conftest import LEAN, only_error_line
from typer.testing import CliRunner

from stepml_evolve.archive.access import opened
from stepml_evolve.archive.map_elites import pareto_front
from stepml_evolve.archive.store import Archive
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.deploy.rules import DEFAULT_RULE, choose, own_seed
from stepml_evolve.evolve.search.settings import SearchConfig

TINY = [
    "--seed-program-fit-evals",
    "6",
    "--full-fit-evals",
    "6",
    "--quick-evals",
    "3",
    "--children",
    "3",
    "--seed",
    "4",
]
TINY += LEAN  # a seed fit from one start is the same with or without the folds; the front's CV still runs


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def run(archive, *extra, generations=1):
    res = invoke("run", "--generations", generations, "--archive", archive, *TINY, *extra)
    assert res.exit_code == 0, res.output
    return res


def programs(archive_dir):
    a = Archive(archive_dir, read_only=True)
    try:
        return a.programs(), {p.id: a.cv_scores(p.id) for p in a.programs()}, a.run()
    finally:
        a.close()


@pytest.fixture(scope="module")
def plain_and_cv(tmp_path_factory):
    plain, cv = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("cv")
    run(plain, "--front-cv", "none")
    run(cv, "--cv", "lomo", "--front-cv", "none")
    return plain, cv


@pytest.fixture(scope="module")
def independent_cv(tmp_path_factory):
    cv = tmp_path_factory.mktemp("independent")
    run(cv, "--cv", "lomo", "--cv-fit-evals", "0", "--front-cv", "none", generations=0)  # the seeds' folds
    return cv


def test_cv_folds_are_warm_started_from_the_full_fit_unless_asked_to_be_independent(plain_and_cv, independent_cv):
    """By default a fold's fit starts from the full fit's constants and closed loop and spends
    --cv-fit-evals (2) evaluations on steps; --cv-fit-evals 0 fits every fold from the child's own
    start with the full-fit budget, as `evolve cv` does. Both are stored as what they are, so a
    front CV at the end never takes a warm score for an independent one."""
    _, warm = plain_and_cv
    warm_progs, warm_scores, _ = programs(warm)
    ind_progs, ind_scores, _ = programs(independent_cv)
    assert [p.constants for p in warm_progs if p.stage == "seed"] == [
        p.constants for p in ind_progs if p.stage == "seed"
    ]  # the fit on every experiment is the same either way
    for p in warm_progs:
        for score in warm_scores[p.id]:
            assert score.method == "trust-region-warm" and score.max_evals == SearchConfig.cv_fit_evals
            assert all(f["evaluations"] <= SearchConfig.cv_fit_evals for f in score.folds)
    ind = [s for p in ind_progs for s in ind_scores[p.id]]
    assert ind and all(s.method == "trust-region" and s.max_evals == 6 for s in ind)
    seeds_warm = sum(s.evaluations for p in warm_progs if p.stage == "seed" for s in warm_scores[p.id])
    seeds_ind = sum(s.evaluations for p in ind_progs if p.stage == "seed" for s in ind_scores[p.id])
    assert seeds_warm < seeds_ind / 1.5


def test_cv_run_validation_loss_is_the_stored_cv_loss(plain_and_cv):
    _, cv = plain_and_cv
    progs, scores, _ = programs(cv)
    full = [p for p in progs if p.full]
    assert len(full) >= 5  # the seeds, at least
    for p in full:
        (score,) = scores[p.id]
        assert score.protocol == "lomo" and len(score.folds) == 4
        assert p.val_loss == pytest.approx(score.loss)
    assert all(not scores[p.id] for p in progs if not p.full)  # screened children are not cross-validated


def test_cv_run_fits_the_same_constants_and_only_changes_the_validation_loss(plain_and_cv):
    """The fit on every experiment is the same fit with or without --cv (same seed): same constants,
    same train and test loss; the validation loss is the CV loss instead of the validation windows'."""
    plain, cv = plain_and_cv
    a, _, _ = programs(plain)
    b, _, _ = programs(cv)
    seeds_a = {p.operator: p for p in a if p.stage == "seed"}
    seeds_b = {p.operator: p for p in b if p.stage == "seed"}
    assert seeds_a.keys() == seeds_b.keys()
    for op, p in seeds_a.items():
        q = seeds_b[op]
        assert p.constants == q.constants and p.train_loss == q.train_loss and p.test_loss == q.test_loss, op
    assert any(seeds_a[op].val_loss != seeds_b[op].val_loss for op in seeds_a)


def test_without_cv_no_scores_and_front_cv_none_skips(plain_and_cv):
    plain, _ = plain_and_cv
    _, scores, run_rec = programs(plain)
    assert not any(scores.values())
    assert all("cv" not in f for f in run_rec.summary["front"])


def test_every_run_ends_with_its_front_cross_validated(tmp_path):
    res = run(tmp_path, "--front-cv", "lowo", "--json")
    out = json.loads(res.stdout)
    progs, scores, run_rec = programs(tmp_path)
    front = pareto_front(progs)
    assert front and {f["id"] for f in out["front"]} == {p.id for p in front}
    for p in front:
        (score,) = [s for s in scores[p.id] if s.protocol == "lowo"]
        assert score.max_evals == 6  # the budget of a promoted child's fit
    for f in out["front"]:
        assert f["cv"]["lowo"] == pytest.approx([s.loss for s in scores[f["id"]]][0])
    assert run_rec.summary["front"] == out["front"]
    # the run says what emit-go deploys by default: the rule's pick, ranked by the front's CV loss
    with opened(tmp_path) as archive:
        chosen = choose(archive, DEFAULT_RULE)
    assert out["deployed"]["id"] == chosen.program.id and out["deployed"]["rule"] == DEFAULT_RULE
    assert "lowo CV loss" in out["deployed"]["why"]
    # and every fully evaluated seed (the guarded rule compares a program with its own seed)
    by_id = {p.id: p for p in progs}
    seeds = {p.id for p in progs if p.operator == "seed" and p.full}
    assert {own_seed(p, by_id).id for p in front} <= seeds
    assert all(s.protocol == "lowo" for i in seeds for s in scores[i]) and all(scores[i] for i in seeds)
    assert not any(scores[p.id] for p in progs if p.id not in {q.id for q in front} | seeds)
    # a resume with nothing left to run scores nothing again (every front member has its score)
    db = sqlite3.connect(tmp_path / Archive.FILE)
    created = db.execute("SELECT program_id, created FROM cv_scores ORDER BY program_id").fetchall()
    db.close()
    res = invoke("run", "--generations", 1, "--archive", tmp_path, *TINY, "--front-cv", "lowo", "--resume")
    assert res.exit_code == 0, res.output
    db = sqlite3.connect(tmp_path / Archive.FILE)
    assert db.execute("SELECT program_id, created FROM cv_scores ORDER BY program_id").fetchall() == created
    db.close()


def forget_setting(archive_dir, name: str) -> None:
    """The run's stored settings without `name`, as an archive from before that setting has them."""
    db = sqlite3.connect(archive_dir / Archive.FILE)
    (config,) = db.execute("SELECT config FROM runs").fetchone()
    config = json.loads(config)
    del config["search"][name]
    db.execute("UPDATE runs SET config=?", (json.dumps(config),))
    db.commit()
    db.close()


def test_resume_with_other_cv_is_refused_and_old_archives_resume_as_none(tmp_path, plain_and_cv):
    _, cv = plain_and_cv
    copy = tmp_path / "copy"
    shutil.copytree(cv, copy)
    only_error_line(invoke("run", "--generations", 2, "--archive", copy, *TINY, "--resume"), "cv: run lomo, now none")
    legacy = tmp_path / "legacy"
    shutil.copytree(plain_and_cv[0], legacy)
    forget_setting(legacy, "cv")
    only_error_line(
        invoke("run", "--generations", 1, "--archive", legacy, *TINY, "--resume", "--cv", "lowo", "--front-cv", "none"),
        "cv: run none, now lowo",
    )
    res = invoke("run", "--generations", 1, "--archive", legacy, *TINY, "--resume", "--front-cv", "none")
    assert res.exit_code == 0, res.output
    # a --cv run from before --cv-fit-evals fitted independent folds: it resumes with 0, and says so
    forget_setting(copy, "cv_fit_evals")
    only_error_line(
        invoke("run", "--generations", 2, "--archive", copy, *TINY, "--resume", "--cv", "lomo"),
        f"cv-fit-evals: run 0, now {SearchConfig.cv_fit_evals}",
    )


def test_cv_needs_data_with_two_models(tmp_path, synthetic):
    one = tmp_path / "one"
    one.mkdir()
    res = invoke("data", "synth", "--out", tmp_path / "all")
    assert res.exit_code == 0, res.output
    # a run that is not overloaded: the overloaded one times out every request of its later splits
    first = tmp_path / "all" / "synth-llama-2-7b-tp1-general"
    shutil.copytree(first, one / first.name)
    only_error_line(
        invoke("run", "--generations", 1, "--archive", tmp_path / "arch", "--data", one, *TINY, "--cv", "lomo"),
        "one model only",
    )
    assert not (tmp_path / "arch").exists()  # refused before an archive is written
    # a plain run on that data ends without a front score, with a note, not an error
    res = invoke("run", "--generations", 0, "--archive", tmp_path / "arch2", "--data", one, *TINY)
    assert res.exit_code == 0, res.output
    assert "skipped: cross-validating the front" in res.stderr
    assert math.isfinite(
        json.loads(invoke("archive", "list", "--archive", tmp_path / "arch2", "--json").stdout)[0]["val_loss"]
    )


def test_cv_groups_file_folds_are_the_files_and_the_run_keeps_them(tmp_path, synthetic):
    """--cv groups:FILE cross-validates each promoted child on the file's folds (as `evolve cv
    --protocol groups:FILE` would); the run stores the folds, not the path, so a resume with a
    changed file is refused; a file the data cannot serve is one line, with no archive written."""
    names = sorted(e.name for e in synthetic.experiments)
    groups = tmp_path / "groups.yaml"
    groups.write_text(f"first: [{names[0]}]\nrest: [{', '.join(names[1:3])}]\n")
    arch = tmp_path / "arch"
    run(arch, "--cv", f"groups:{groups}", "--front-cv", "none")
    progs, scores, stored = programs(arch)
    search = stored.config["search"]
    assert search["cv"] == "groups" and search["cv_groups"] == [["first", [names[0]]], ["rest", names[1:3]]]
    scored = [s for p in progs for s in scores[p.id]]
    assert scored and {s.protocol for s in scored} == {"groups"}
    by_id = {p.id: p for p in progs}
    assert all(math.isclose(by_id[s.program_id].val_loss, s.loss) for s in scored)
    # the run stores the folds: a groups file changed since is another run's
    groups.write_text(f"first: [{names[1]}]\n")
    only_error_line(
        invoke(
            "run",
            "--generations",
            2,
            "--archive",
            arch,
            *TINY,
            "--resume",
            "--front-cv",
            "none",
            "--cv",
            f"groups:{groups}",
        ),
        "cv-groups: run",
    )
    groups.write_text(f"first: [{names[0]}]\nrest: [{', '.join(names[1:3])}]\n")
    run(arch, "--cv", f"groups:{groups}", "--front-cv", "none", "--resume", generations=2)
    groups.write_text(f"first: [{names[0]}, not-an-experiment]\n")
    only_error_line(
        invoke("run", "--generations", 1, "--archive", tmp_path / "bad", *TINY, "--cv", f"groups:{groups}"),
        f"{groups}: fold 'first' names 'not-an-experiment'",
    )
    groups.write_text("all: [" + ", ".join(names) + "]\n")
    only_error_line(
        invoke("run", "--generations", 1, "--archive", tmp_path / "bad", *TINY, "--cv", f"groups:{groups}"),
        "holds out every experiment",
    )
    only_error_line(
        invoke("run", "--generations", 1, "--archive", tmp_path / "bad", *TINY, "--cv", "lomx"), "--cv must be"
    )
    assert not (tmp_path / "bad").exists()


def test_front_cv_of_a_groups_file_ranks_what_is_deployed(tmp_path):
    """--front-cv groups:FILE: the run's end asks the question of the file (here: another TP), the
    deployment rule ranks by it, and a file the data cannot serve fails before the search."""
    groups = tmp_path / "by-tp.yaml"
    groups.write_text(
        "tp2: [synth-codellama-34b-tp2-reasoning, synth-mixtral-8x7b-tp2-roleplay]\ntp4: [synth-llama-2-70b-tp4-codegen]\n"
    )
    protocol = f"groups:{groups}"
    out = json.loads(run(tmp_path / "a", "--front-cv", protocol, "--json").stdout)
    progs, scores, _ = programs(tmp_path / "a")
    seeds = {p.id for p in progs if p.operator == "seed" and p.full}
    for pid in {p.id for p in pareto_front(progs)} | seeds:
        (score,) = scores[pid]
        assert score.protocol == protocol and {f["name"] for f in score.folds} == {"tp2", "tp4"}
    with opened(tmp_path / "a") as archive:
        chosen = choose(archive, DEFAULT_RULE)
    assert chosen.protocol == protocol and out["deployed"]["id"] == chosen.program.id
    assert f"{protocol} CV loss" in out["deployed"]["why"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("tp8: [no-such-experiment]\n")
    for flag in ("--front-cv", "--guard-cv"):  # the run's end's two questions
        res = invoke("run", "--generations", 1, "--archive", tmp_path / "b", *TINY, flag, f"groups:{bad}")
        only_error_line(res, f"{bad}: fold 'tp8' names 'no-such-experiment'")
        assert not (tmp_path / "b" / Archive.FILE).exists()
    res = invoke("run", "--generations", 1, "--archive", tmp_path / "b", *TINY, "--guard-cv", "lomo-ish")
    only_error_line(res, "--guard-cv must be one of lomo, lowo, none or groups:FILE, not 'lomo-ish'")
