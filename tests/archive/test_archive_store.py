"""The archive's typed records and schema: round trips, schema derived from the records, schema
versions (refused when newer or without a migration path, migrated in place when one exists),
and the add-status query the search asks before promoting a child."""

from __future__ import annotations

import dataclasses
import math
import sqlite3

import pytest
from conftest import downgrade_to_schema_1, table_schemas
from typer.testing import CliRunner

import stepml_evolve.archive.store as store
from stepml_evolve.archive.map_elites import AddStatus, Elites, cell_of
from stepml_evolve.archive.records import (
    EvaluationRecord,
    GenerationRecord,
    LLMCallRecord,
    NewProgram,
    ProgramRecord,
    RejectionRecord,
    column_names,
)
from stepml_evolve.archive.store import TABLES, Archive, ArchiveError
from stepml_evolve.evaluator.scoring.metrics import Errors, Means, MetricRow, Timeouts
from stepml_evolve.evolve.cli.app import app


def _program(
    i: int,
    complexity: int = 10,
    n_components: int = 1,
    val: float | None = 5.0,
    screen: float | None = 4.0,
    stage: str = "full",
) -> ProgramRecord:
    return ProgramRecord(
        id=None,
        source_hash=f"h{i}",
        source=f"CONSTANTS = {{}}\n\ndef step_time(f, c):\n    return {i}.0\n",
        constants={"a": 1.5, "b": -2.0},
        parents=[i - 1] if i > 1 else [],
        operator="subtree",
        operator_detail="subtree on step_time",
        island=0,
        complexity=complexity,
        n_components=n_components,
        components=["tokens"],
        quick_loss=3.0,
        screen_loss=screen,
        train_loss=val,
        val_loss=val,
        test_loss=val,
        stage=stage,
    )


def _row(name: str, split: str, **kw) -> MetricRow:
    base = dict(
        name=name,
        split=split,
        n_requests=10,
        observed=Means(1.0, 0.1, 20.0),
        predicted=Means(1.1, math.nan, 21.0),
        ape=Errors(10.0, math.nan, 5.0),
        timeouts=Timeouts(1, 2),
    )
    return MetricRow(**{**base, **kw})


def test_every_record_round_trips_through_the_database(tmp_path):
    a = Archive(tmp_path, create=True)
    run_id = a.create_run("label", "fp", True, 3, {"search": {"children": 2}, "seeds": None})
    rows = [
        _row("exp-a", "train", e2e_percentiles_s={"observed": {"p50": 1.0}, "predicted": {"p50": 1.2}}),
        _row(
            "exp-b", "test", ape=Errors(math.inf, math.inf, math.inf), timeouts=Timeouts(0, -1), error="NaN step time"
        ),
    ]
    call = LLMCallRecord(
        model="m",
        request_hash="h",
        prompt_tokens=7,
        completion_tokens=3,
        cost_usd=0.5,
        latency_s=1.25,
        outcome="valid",
        error=None,
        cached=True,
        program_index=1,
    )
    rejection = RejectionRecord(operator="llm:m", parents=[1], rule="llm-no-code", reason="no code", source=None)
    ids = a.write_generation(
        run_id,
        0,
        2.5,
        [NewProgram(_program(1)), NewProgram(_program(2), rows)],
        [rejection],
        [call],
        GenerationRecord(n_children=2, n_promoted=1, best_val=5.0, best_train=5.0, evaluations=9),
    )
    back = a.programs(run_id)
    assert [p.id for p in back] == ids
    assert dataclasses.replace(back[1], id=None, run_id=0) == _program(2)
    # MetricRow -> evaluations table -> MetricRow: undefined and infinite APE come back as None
    stored = {r.name: r for r in a.metric_rows(ids[1])}
    assert stored["exp-a"].e2e_percentiles_s == rows[0].e2e_percentiles_s and stored["exp-a"].ape == Errors(
        10.0, None, 5.0
    )
    assert math.isnan(stored["exp-a"].predicted.ttft_mean_s)
    assert stored["exp-b"].error == "NaN step time" and stored["exp-b"].ape == Errors(None, None, None)
    assert stored["exp-b"].timeouts == Timeouts(0, -1)
    assert a.metric_rows(ids[1], "test") == [stored["exp-b"]]
    (c,) = a.llm_calls(run_id)
    assert (c.program_id, c.cached, c.latency_s, c.generation) == (ids[1], True, 1.25, 0)
    (rj,) = a.rejections(run_id)
    assert (rj.parents, rj.rule, rj.source, rj.generation) == ([1], "llm-no-code", None, 0)
    (g,) = a.generations(run_id)
    assert (g.n_children, g.n_promoted, g.evaluations, g.seconds) == (2, 1, 9, 2.5)
    run = a.run()
    assert (run.id, run.synthetic, run.seed, run.config["search"]) == (run_id, True, 3, {"children": 2})
    a.set_summary(run_id, {"best": {"id": ids[1]}})
    assert a.run(run_id).summary == {"best": {"id": ids[1]}}
    a.close()


def test_the_schema_is_the_records(tmp_path):
    a = Archive(tmp_path, create=True)
    for table, record, _ in TABLES:
        columns = tuple(r[1] for r in a.db.execute(f"PRAGMA table_info({table})"))
        assert columns == column_names(record), table
    assert "program_index" not in column_names(LLMCallRecord)  # transient: travels with the record only
    assert a.schema_version() == store.SCHEMA_VERSION
    a.close()


def _set_version(directory, version: str) -> None:
    db = sqlite3.connect(directory / Archive.FILE)
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (version,))
    db.commit()
    db.close()


def test_an_archive_of_a_newer_schema_is_refused_in_one_line(tmp_path):
    Archive(tmp_path, create=True).close()
    _set_version(tmp_path, str(store.SCHEMA_VERSION + 1))
    for kwargs in ({}, {"read_only": True}):
        with pytest.raises(ArchiveError, match=r"archive schema \d+ is newer than this stepml-evolve reads"):
            Archive(tmp_path, **kwargs)
    res = CliRunner().invoke(app, ["archive", "list", "--archive", str(tmp_path)])
    assert res.exit_code == 2 and "is newer than this stepml-evolve reads" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_an_older_schema_is_migrated_in_place_or_refused_without_a_path(tmp_path, monkeypatch):
    Archive(tmp_path, create=True).close()

    def add_note_column(db):
        db.execute("ALTER TABLE runs ADD COLUMN note TEXT")

    monkeypatch.setattr(store, "SCHEMA_VERSION", store.SCHEMA_VERSION + 1)
    with pytest.raises(ArchiveError, match="no migration from"):
        Archive(tmp_path)
    monkeypatch.setattr(store, "MIGRATIONS", {store.SCHEMA_VERSION - 1: add_note_column})
    with pytest.raises(ArchiveError, match="is older than this stepml-evolve reads"):
        Archive(tmp_path, read_only=True)  # browsing never writes, so it cannot migrate
    a = Archive(tmp_path)
    assert a.schema_version() == store.SCHEMA_VERSION
    assert "note" in {r[1] for r in a.db.execute("PRAGMA table_info(runs)")}
    a.close()
    Archive(tmp_path, read_only=True).close()  # now current


def test_a_schema_1_archive_gets_the_cv_tables_of_a_new_archive(tmp_path):
    """Schema 1 (before CV scores) is schema 2 without cv_scores and cv_evaluations, schema 2 is
    schema 3 without explanations: migrated when opened for writing, to exactly the tables a new
    archive has, its records untouched."""
    new, old = tmp_path / "new", tmp_path / "old"
    for d in (new, old):
        a = Archive(d, create=True)
        run_id = a.create_run("label", "fp", True, 3, {})
        a.write_generation(
            run_id, 0, 1.0, [NewProgram(_program(1), [_row("exp-a", "train")])], [], [], GenerationRecord()
        )
        a.close()
    downgrade_to_schema_1(old)
    with pytest.raises(ArchiveError, match=r"archive schema 1 is older .*`evolve archive migrate --archive "):
        Archive(old, read_only=True)
    a = Archive(old)
    assert a.migrated_from == 1 and a.schema_version() == store.SCHEMA_VERSION == 3
    assert a.cv_scores() == [] and a.explanations() == [] and [p.source for p in a.programs()] == [_program(1).source]
    assert len(a.metric_rows(1)) == 1
    a.close()
    assert table_schemas(old) == table_schemas(new)
    assert Archive(old, read_only=True).migrated_from is None


def test_an_archive_without_a_schema_version_is_refused(tmp_path):
    Archive(tmp_path, create=True).close()
    db = sqlite3.connect(tmp_path / Archive.FILE)
    db.execute("DELETE FROM meta")
    db.commit()
    db.close()
    with pytest.raises(ArchiveError, match="records no schema version"):
        Archive(tmp_path)


def _stored(p: ProgramRecord, i: int) -> ProgramRecord:
    return dataclasses.replace(p, id=i)


def test_elites_answer_whether_a_candidate_opens_a_cell_improves_or_not():
    elite = _stored(_program(1, complexity=20, n_components=2, val=5.0, screen=4.0), 1)
    simple = _stored(_program(2, complexity=8, n_components=1, val=9.0, screen=8.0), 2)
    screened = _stored(_program(3, complexity=20, n_components=2, val=None, screen=None, stage="screened"), 3)
    elites = Elites.of([elite, simple, screened])
    assert elites.grid == {cell_of(20, 2): elite, cell_of(8, 1): simple}
    assert [p.id for p in elites.front] == [2, 1] and elites.best_screen_loss() == 4.0
    assert elites.status(40, 3, 100.0, 0.05) == (AddStatus.NEW_CELL, 100.0)
    # same cell as #1: references are the cell elite (4.0) and the best simpler front member (4.0)
    status, ratio = elites.status(20, 2, 3.0, 0.05)
    assert status is AddStatus.IMPROVES and ratio == pytest.approx(0.75)
    assert elites.status(20, 2, 4.1, 0.05)[0] is AddStatus.IMPROVES  # within the 5 % margin
    assert elites.status(20, 2, 4.3, 0.05)[0] is AddStatus.NOT_ADDED
    # a simpler program in #2's cell need only beat #2 (the front has nothing simpler)
    assert elites.status(9, 1, 7.9, 0.0)[0] is AddStatus.IMPROVES
    assert elites.status(9, 1, 8.1, 0.0)[0] is AddStatus.NOT_ADDED


def test_a_child_opening_a_cell_that_beats_the_simpler_front_queues_with_the_improvements():
    elite = _stored(_program(1, complexity=20, n_components=2, val=5.0, screen=4.0), 1)
    simple = _stored(_program(2, complexity=8, n_components=1, val=9.0, screen=8.0), 2)
    elites = Elites.of([elite, simple])
    # an empty cell, more complex than the front: beating #1's 4.0 puts it with the improvements
    assert elites.promotion_key(40, 3, 3.0, 0.05) == (0, pytest.approx(0.75))
    improver = elites.promotion_key(20, 2, 3.6, 0.05)  # improves #1's cell by 10 %
    assert improver == (0, pytest.approx(0.9)) and elites.promotion_key(40, 3, 3.0, 0.05) < improver
    # one that does not beat the front only opens its cell, after every improvement, by its own loss
    assert elites.promotion_key(40, 3, 6.0, 0.05) == (1, 6.0) > improver
    # an empty cell simpler than the whole front has no simpler program to beat: it opens a cell
    assert elites.promotion_key(4, 1, 1.0, 0.05) == (1, 1.0)
    assert elites.promotion_key(20, 2, 4.3, 0.05) is None


def test_an_evaluation_record_stores_undefined_errors_as_null():
    rec = EvaluationRecord.of(7, _row("x", "validate", ape=Errors(math.nan, math.inf, 2.0)))
    assert (rec.ape_e2e, rec.ape_ttft, rec.ape_itl, rec.extra) == (None, None, 2.0, None)
    assert rec.metric_row().ape == Errors(None, None, 2.0)
