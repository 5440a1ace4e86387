"""The search: same seed -> same archive; SIGKILL then --resume loses and duplicates nothing."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import TINY_BUDGETS, FixedEmitter, snapshot
from typer.testing import CliRunner

from stepml_evolve.archive.store import Archive
from stepml_evolve.evolve.cli.app import app

GENERATIONS = 4  # the reference run: stops after 0 and 2, a SIGKILL inside 4, and children promoted
SMALL = [*TINY_BUDGETS, "--front-cv", "none"]


def run(archive, generations, *extra, seed=3):
    res = CliRunner().invoke(
        app, ["run", "--generations", str(generations), "--seed", str(seed), "--archive", str(archive), *SMALL, *extra]
    )
    assert res.exit_code == 0, res.output
    return res


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    run(d, GENERATIONS)
    return d, snapshot(d)


@pytest.fixture(scope="module")
def interrupted(reference, tmp_path_factory):
    """The reference run again, interrupted every way a run can be, in one chain (one run's cost
    instead of three): stopped after generation 0 (the seeds alone) and after generation 2, both
    with one worker; resumed in a subprocess killed with SIGKILL inside a later generation; resumed
    to the end with one worker. The snapshot after each stage is kept for the tests below."""
    d = tmp_path_factory.mktemp("interrupted")
    stops = {}
    for stop in (0, 2):
        run(d, stop, "--workers", "1", *(["--resume"] if stop else []))
        stops[stop] = snapshot(d)
    killed_after, killed = sigkill_inside_a_generation(d, after=3)
    run(d, GENERATIONS, "--workers", "1", "--resume")
    return {"stops": stops, "killed_after": killed_after, "killed": killed, "end": snapshot(d)}


def sigkill_inside_a_generation(archive_dir, after: int):
    """Resume the run in a subprocess and SIGKILL it once generation `after` is committed (landing
    inside the next one); (the generation seen, the archive's snapshot after the kill)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepml_evolve",
            "run",
            "--generations",
            str(GENERATIONS),
            "--seed",
            "3",
            "--archive",
            str(archive_dir),
            "--resume",
            *SMALL,
        ],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    db_path = archive_dir / Archive.FILE
    deadline = time.time() + 300
    killed_after = None
    while time.time() < deadline and proc.poll() is None:
        try:
            db = sqlite3.connect(db_path, timeout=1)
            row = db.execute("SELECT MAX(generation) FROM generations").fetchone()
            db.close()
        except sqlite3.OperationalError:
            row = (None,)
        if row[0] is not None and row[0] >= after:
            time.sleep(0.3)  # land inside the next generation
            proc.send_signal(signal.SIGKILL)
            killed_after = row[0]
            break
        time.sleep(0.05)
    proc.wait(timeout=30)
    return killed_after, snapshot(archive_dir)


def test_same_seed_and_data_give_the_same_archive(reference, interrupted):
    """The same seed and data give the same archive whatever the worker count (the chain ran with
    one worker, the reference with two) and however the run was interrupted."""
    _, ref = reference
    assert interrupted["end"] == ref
    assert len(ref["programs"]) > 8 and any(p[17] == "full" for p in ref["programs"][4:])  # children got promoted


def test_archive_records_programs_evaluations_and_rejections(reference):
    d, ref = reference
    a = Archive.open(d)
    run_row = a.run()
    progs = a.programs(run_row.id)
    seeds = [p for p in progs if p.operator == "seed"]
    assert {p.operator_detail for p in seeds} >= {"roofline", "regime_switch", "trained_physics"}
    # every shipped seed holds the floor: none is refused in generation 0 (blackbox is a baseline)
    assert [r for r in a.rejections(run_row.id) if r.operator == "seed"] == []
    assert "blackbox" not in {p.operator_detail for p in seeds}
    child = next(p for p in progs if p.operator != "seed")
    assert child.parents and all(a.program(pid) for pid in child.parents)
    assert child.complexity > 0 and child.components
    full = next(p for p in progs if p.stage == "full")
    evs = a.evaluations(full.id)
    assert {e.split for e in evs} == {"train", "validate", "test"}
    assert len(evs) == 3 * 4
    assert ref["rejections"], "a 4-generation run rejects some children"
    assert all(r[4] and r[5] for r in ref["rejections"])  # every rejection has a rule and a reason
    assert [g[0] for g in ref["generations"]] == list(range(GENERATIONS + 1))
    summary = run_row.summary
    assert summary["best"]["id"] == min((p for p in progs if p.full), key=lambda p: (p.val_loss, p.id)).id
    assert len(summary["best"]["test"]) == 4 and all("ape" in t for t in summary["best"]["test"])


def test_sigkill_then_resume_continues_from_last_completed_generation(reference, interrupted):
    _, ref = reference
    assert interrupted["killed_after"] is not None, "the run finished or never reached generation 3"
    partial = interrupted["killed"]
    last = partial["generations"][-1][0]
    assert last < GENERATIONS
    # nothing of an unfinished generation is visible
    assert all(p[1] <= last for p in partial["programs"])
    assert partial["programs"] == ref["programs"][: len(partial["programs"])]
    assert interrupted["end"] == ref


def test_a_second_run_into_the_same_archive_needs_resume(reference):
    d, _ = reference
    res = CliRunner().invoke(
        app, ["run", "--generations", str(GENERATIONS), "--seed", "3", "--archive", str(d), *SMALL]
    )
    assert res.exit_code == 2 and "--resume" in res.stderr


def test_resume_refuses_other_search_settings(reference):
    d, _ = reference
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--generations",
            "6",
            "--seed",
            "3",
            "--archive",
            str(d),
            "--resume",
            "--seed-program-fit-evals",
            "40",
            "--full-fit-evals",
            "24",
            "--quick-evals",
            "16",
            "--children",
            "7",
        ],
    )
    assert res.exit_code == 2 and "other search settings" in res.stderr
    assert "children: run 5, now 7" in res.stderr


def test_run_refuses_a_corrupt_or_foreign_database_with_one_line(tmp_path):
    corrupt, foreign = tmp_path / "corrupt", tmp_path / "foreign"
    corrupt.mkdir()
    (corrupt / Archive.FILE).write_bytes(b"\x00garbage" * 500)
    foreign.mkdir()
    db = sqlite3.connect(foreign / Archive.FILE)
    db.execute("CREATE TABLE users (name TEXT)")
    db.commit()
    db.close()
    for d, message in ((corrupt, "not a readable archive"), (foreign, "not a stepml-evolve archive")):
        for extra in ([], ["--resume"]):
            res = CliRunner().invoke(app, ["run", "--generations", "1", "--archive", str(d), *SMALL, *extra])
            assert res.exit_code == 2, res.output
            last = res.stderr.strip().splitlines()[-1]
            assert message in last and str(d / Archive.FILE) in last and "Traceback" not in res.output
    db = sqlite3.connect(foreign / Archive.FILE)
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["users"]  # untouched
    db.close()
    assert (corrupt / Archive.FILE).read_bytes() == b"\x00garbage" * 500


def test_islands_evolve_separately_and_exchange_their_best(tmp_path):
    run(tmp_path, 4, "--islands", "2", "--migration-interval", "2", seed=4)
    a = Archive.open(tmp_path)
    progs = a.programs(a.run().id)
    by_id = {p.id: p for p in progs}
    assert {p.island for p in progs} == {0, 1}
    migrants = [p for p in progs if p.operator == "migration"]
    assert migrants and {m.generation for m in migrants} <= {2, 4}
    for m in migrants:
        origin = by_id[m.parents[0]]
        assert origin.island != m.island and origin.source == m.source and origin.val_loss == m.val_loss
        assert a.evaluations(m.id)  # migrants carry their evaluations
    for p in progs:
        if p.operator not in ("seed", "migration"):
            assert p.island == p.generation % 2  # generation g works on island g mod 2
            assert all(by_id[q].island == p.island for q in p.parents)


# ---- user seeds: a saved winner (or any program file) starts a new search ----


def test_a_saved_winner_seeds_a_new_run(reference, tmp_path):
    d, _ = reference
    shown = CliRunner().invoke(app, ["archive", "show", "best", "--archive", str(d), "--source"])
    assert shown.exit_code == 0, shown.output
    seeds_dir = tmp_path / "seeds"
    seeds_dir.mkdir()
    (seeds_dir / "winner.py").write_text(shown.stdout)
    (seeds_dir / "_ignored.py").write_text("not a program")
    from stepml_evolve.seeds import seed_path

    extra = tmp_path / "rf.py"
    extra.write_text(seed_path("roofline").read_text())
    run(tmp_path / "run", 1, "--seed-programs", str(seeds_dir), "--seed-programs", str(extra))
    a = Archive.open(tmp_path / "run")
    run_row = a.run()
    gen0 = [p for p in a.programs(run_row.id) if p.generation == 0]
    a.close()
    assert [(p.operator, p.operator_detail) for p in gen0] == [("seed", "winner"), ("seed", "rf")]
    ref = Archive.open(d)
    best = min((p for p in ref.programs(ref.run().id) if p.full), key=lambda p: (p.val_loss, p.id))
    ref.close()
    from stepml_evolve.evaluator.dsl import parse_program
    from stepml_evolve.evolve.search import structure_hash

    assert structure_hash(parse_program(gen0[0].source)) == structure_hash(parse_program(best.source))
    assert set(run_row.config["seeds"]) == {"winner", "rf"}
    # resuming needs the same seeds: the shipped ones are not the ones this run started from
    res = CliRunner().invoke(
        app, ["run", "--generations", "2", "--seed", "3", "--archive", str(tmp_path / "run"), "--resume", *SMALL]
    )
    assert res.exit_code == 2 and "other search settings" in res.stderr


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such seed program file or directory"),
        ("import os\n", "line 1"),
        ("CONSTANTS = {}\n", "step_time"),
    ],
)
def test_a_bad_seed_is_a_one_line_error_naming_the_file(tmp_path, content, message):
    seed = tmp_path / "mine.py"
    if content is not None:
        seed.write_text(content)
    res = CliRunner().invoke(
        app, ["run", "--generations", "1", "--archive", str(tmp_path / "run"), "--seed-programs", str(seed), *SMALL]
    )
    assert res.exit_code == 2, res.output
    assert str(seed) in res.stderr and message in res.stderr and res.stderr.strip().count("\n") == 0, res.stderr
    assert not (tmp_path / "run" / Archive.FILE).exists() or Archive(tmp_path / "run").run() is None


def test_a_resumed_search_rebuilds_the_live_duplicate_filter_and_programs(tmp_path):
    """What a resumed run knows must equal what the uninterrupted run knew at that generation,
    seeds and children that failed evaluation included, or the two runs diverge."""
    from stepml_evolve.evaluator.datasets import load_data
    from stepml_evolve.evaluator.scoring.pool import ReplayPool
    from stepml_evolve.evolve.search import Search, SearchConfig
    from stepml_evolve.evolve.search.emitters import SymbolicEmitter

    loaded = load_data(None)
    cfg = SearchConfig(
        generations=2,
        seed=3,
        children=5,
        seed_fit_evals=16,
        full_fit_evals=12,
        quick_evals=8,
        time_components="free",  # the failing child below uses no time component
        physics="off",  # which leaves it below the floor: it must reach evaluation to fail there
    )
    # beside the symbolic children, one whose every step time is 0/0: it fails evaluation
    failing = FixedEmitter(
        'CONSTANTS = {"base_us": 2000.0}\n\n'
        "def step_time(f, c):\n    return c.base_us * f.n_req / (f.n_req - f.n_req)\n"
    )
    failing.share = 0.3
    with ReplayPool(loaded.experiments, 2) as pool:
        archive = Archive(tmp_path, create=True)
        live = Search(archive, loaded, pool, cfg, [SymbolicEmitter(), failing])
        live.run()
        resumed = Search(archive, loaded, pool, cfg, [SymbolicEmitter(), failing], resume=True)
        rules = {r.rule for r in archive.rejections(live.run_id)}
        archive.close()
    assert "evaluation" in rules  # the case that used to be forgotten is exercised
    assert resumed.structures == live.structures
    # what the live run kept of what it wrote is what the archive reads back
    assert resumed.programs == live.programs and resumed.completed == live.completed
    assert resumed.rejection_counts == live.rejection_counts
    assert len(live.structures) > 5


def test_stop_at_each_generation_then_resume_gives_the_uninterrupted_archive(reference, interrupted):
    """Stopped after generation 0 (the seeds alone), resumed and stopped after generation 2, then
    resumed to the end: each stop keeps what the uninterrupted run had, the end is that run."""
    _, ref = reference
    for stop, partial in interrupted["stops"].items():
        assert partial["generations"][-1][0] == stop, f"stopped after generation {stop}"
        assert partial["programs"] == [p for p in ref["programs"] if p[1] <= stop], f"stopped after generation {stop}"
    assert interrupted["end"] == ref


def test_a_new_emitter_plugs_into_the_loop_and_hears_what_became_of_its_children(tmp_path):
    from stepml_evolve.evaluator.datasets import load_data
    from stepml_evolve.evaluator.scoring.pool import ReplayPool
    from stepml_evolve.evolve.search import Search, SearchConfig
    from stepml_evolve.evolve.search.emitters import SymbolicEmitter
    from stepml_evolve.seeds import seed_path

    child = (
        'CONSTANTS = {"base_us": 2000.0, "c": 1.5}\n\n'
        "def step_time(f, c):\n    return c.base_us + c.c * (f.weights + f.kv_read + f.kv_write + f.gemm_pf + f.gemm_dc"
        " + f.attn_pf + f.attn_dc) + f.allreduce\n"
    )
    fixed = FixedEmitter(child)
    loaded = load_data(None)
    cfg = SearchConfig(
        generations=2,
        seed=3,
        children=2,
        seed_fit_evals=16,
        full_fit_evals=8,
        quick_evals=8,
        time_components="free",  # the fixed child drops some of roofline's components
    )
    seeds = [("roofline", seed_path("roofline").read_text())]
    with ReplayPool(loaded.experiments, 2) as pool:
        archive = Archive(tmp_path, create=True)
        search = Search(archive, loaded, pool, cfg, [SymbolicEmitter(), fixed], seeds=seeds)
        search.run()
        programs = archive.programs(search.run_id)
        rejections = archive.rejections(search.run_id)
        archive.close()
    mine = [p for p in programs if p.operator == "fixed"]
    assert (
        len(mine) == 1
        and mine[0].parents == [programs[0].id]
        and mine[0].operator_detail == "the same child every time"
    )
    # generation 1: child 1 is a duplicate of child 0 (told at once), child 0 is archived as the generation's
    # program 0 (told after its fit); generation 2: both are duplicates
    assert fixed.told == [("duplicate", None), ("archived", 0), ("duplicate", None), ("duplicate", None)]
    assert [(r.operator, r.rule) for r in rejections] == [("fixed", "duplicate")] * 3
    assert search.status(2)["fixed_told"] == 4
