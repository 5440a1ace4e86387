"""The search: same seed -> same archive; SIGKILL then --resume loses and duplicates nothing."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from archive.store import Archive
from evolve.cli import app

SMALL = ["--seed-fit-evals", "40", "--full-fit-evals", "24", "--quick-evals", "16", "--children", "5"]


def run(archive, generations, *extra, seed=3):
    res = CliRunner().invoke(app, ["run", "--generations", str(generations), "--seed", str(seed), "--archive", str(archive),
                                   *SMALL, *extra])
    assert res.exit_code == 0, res.output
    return res


def snapshot(archive_dir) -> dict:
    """Everything in the archive except wall-clock times."""
    db = sqlite3.connect(archive_dir / Archive.FILE)
    q = {
        "programs": "SELECT id, generation, source_hash, source, constants, parents, operator, operator_detail, island, complexity,"
                    " n_components, components, quick_loss, screen_loss, train_loss, val_loss, test_loss, stage FROM programs ORDER BY id",
        "evaluations": "SELECT * FROM evaluations ORDER BY program_id, experiment, split",
        "rejections": "SELECT id, generation, operator, parents, rule, reason, source FROM rejections ORDER BY id",
        "generations": "SELECT generation, n_children, n_rejected, n_promoted, best_train, best_val, evaluations FROM generations ORDER BY generation",
        "llm_calls": "SELECT id, generation, model, request_hash, outcome, program_id FROM llm_calls ORDER BY id",
    }
    out = {k: db.execute(v).fetchall() for k, v in q.items()}
    db.close()
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    run(d, 5)
    return d, snapshot(d)


def test_same_seed_and_data_give_the_same_archive(reference, tmp_path):
    _, ref = reference
    run(tmp_path, 5, "--workers", "1")
    assert snapshot(tmp_path) == ref
    assert len(ref["programs"]) > 15 and any(p[17] == "full" for p in ref["programs"][5:])  # children got promoted


def test_archive_records_programs_evaluations_and_rejections(reference):
    d, ref = reference
    a = Archive(d)
    run_row = a.run()
    progs = a.programs(run_row["id"])
    seeds = [p for p in progs if p.operator == "seed"]
    assert {p.operator_detail for p in seeds} >= {"roofline", "blackbox", "trained_physics"}
    child = next(p for p in progs if p.operator != "seed")
    assert child.parents and all(a.program(pid) for pid in child.parents)
    assert child.complexity > 0 and child.components
    full = next(p for p in progs if p.stage == "full")
    evs = a.evaluations(full.id)
    assert {e["split"] for e in evs} == {"train", "validate", "test"}
    assert len(evs) == 3 * 4
    assert ref["rejections"], "a 5-generation run rejects some children"
    assert all(r[4] and r[5] for r in ref["rejections"])  # every rejection has a rule and a reason
    assert [g[0] for g in ref["generations"]] == [0, 1, 2, 3, 4, 5]
    summary = run_row["summary"]
    assert summary["best"]["id"] == min((p for p in progs if p.full), key=lambda p: (p.val_loss, p.id)).id
    assert len(summary["best"]["test"]) == 4 and all("ape" in t for t in summary["best"]["test"])


def test_sigkill_then_resume_continues_from_last_completed_generation(reference, tmp_path):
    _, ref = reference
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "evolve", "run", "--generations", "5", "--seed", "3", "--archive",
                             str(tmp_path), *SMALL], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db_path = tmp_path / Archive.FILE
    deadline = time.time() + 300
    killed_after = None
    while time.time() < deadline and proc.poll() is None:
        if db_path.exists():
            try:
                db = sqlite3.connect(db_path, timeout=1)
                row = db.execute("SELECT MAX(generation) FROM generations").fetchone()
                db.close()
            except sqlite3.OperationalError:
                row = (None,)
            if row[0] is not None and row[0] >= 2:
                time.sleep(0.3)  # land inside generation 3
                proc.send_signal(signal.SIGKILL)
                killed_after = row[0]
                break
        time.sleep(0.05)
    proc.wait(timeout=30)
    assert killed_after is not None, "the run finished or never reached generation 2"
    partial = snapshot(tmp_path)
    last = partial["generations"][-1][0]
    assert last < 5
    # nothing of an unfinished generation is visible
    assert all(p[1] <= last for p in partial["programs"])
    assert partial["programs"] == ref["programs"][: len(partial["programs"])]
    res = CliRunner().invoke(app, ["run", "--generations", "5", "--seed", "3", "--archive", str(tmp_path), "--resume", *SMALL])
    assert res.exit_code == 0, res.output
    assert snapshot(tmp_path) == ref


def test_a_second_run_into_the_same_archive_needs_resume(reference):
    d, _ = reference
    res = CliRunner().invoke(app, ["run", "--generations", "5", "--seed", "3", "--archive", str(d), *SMALL])
    assert res.exit_code == 2 and "--resume" in res.stderr


def test_resume_refuses_other_search_settings(reference):
    d, _ = reference
    res = CliRunner().invoke(app, ["run", "--generations", "6", "--seed", "3", "--archive", str(d), "--resume",
                                   "--seed-fit-evals", "40", "--full-fit-evals", "24", "--quick-evals", "16", "--children", "7"])
    assert res.exit_code == 2 and "other search settings" in res.stderr


def test_islands_evolve_separately_and_exchange_their_best(tmp_path):
    run(tmp_path, 4, "--islands", "2", "--migration-interval", "2", seed=4)
    a = Archive(tmp_path)
    progs = a.programs(a.run()["id"])
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
