"""`evolve archive`: list/show/pareto/diff agree with the archive, and the HTML report stands alone."""

from __future__ import annotations

import http.server
import json
import math
import os
import re
import shutil
import sqlite3
import threading
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepml_evolve.archive.access import BrowseError, latest_archive_dir
from stepml_evolve.archive.map_elites import cell_of, pareto_front
from stepml_evolve.archive.records import GenerationRecord, LLMCallRecord, NewProgram, ProgramRecord, RejectionRecord
from stepml_evolve.archive.store import Archive
from stepml_evolve.evolve.cli.app import app as main_app


@pytest.fixture(scope="module")
def archive_dir(searched_archive):
    return searched_archive


@pytest.fixture(scope="module")
def records(archive_dir):
    a = Archive.open(archive_dir)  # read-only: other test files read the same archive at the same time
    programs = a.programs(a.run().id)
    evaluations = {p.id: a.evaluations(p.id) for p in programs}
    a.close()
    return programs, evaluations


def invoke(*args, ok: bool = True):
    res = CliRunner().invoke(main_app, ["archive", *map(str, args)])
    if ok:
        assert res.exit_code == 0, res.output
    return res


def as_json(*args):
    return json.loads(invoke(*args, "--json").stdout)


def full(programs):
    return [p for p in programs if p.stage in ("seed", "full")]


# ---- list ----


def test_list_defaults_to_fully_evaluated_programs_by_validation_loss(archive_dir, records):
    programs, _ = records
    rows = as_json("list", "--archive", archive_dir)
    assert {r["id"] for r in rows} == {p.id for p in full(programs)}
    vals = [r["val_loss"] for r in rows]
    assert vals == sorted(vals)
    by_id = {p.id: p for p in programs}
    for r in rows:
        p = by_id[r["id"]]
        assert (r["generation"], r["complexity"], r["components"], r["parents"]) == (
            p.generation,
            p.complexity,
            p.components,
            p.parents,
        )
        assert r["val_loss"] == pytest.approx(p.val_loss) and r["cell"] == list(cell_of(p.complexity, p.n_components))
        assert set(r) == {
            "id",
            "generation",
            "operator",
            "operator_detail",
            "refit_of",
            "parents",
            "train_loss",
            "val_loss",
            "test_loss",
            "quick_loss",
            "complexity",
            "n_components",
            "components",
            "stage",
            "cell",
            "cv",
        }
    # the run ended by cross-validating its front and its seeds (--front-cv lomo, the default) and nothing else
    front = {r["id"] for r in as_json("pareto", "--archive", archive_dir)}
    scored = front | {p.id for p in full(programs) if p.operator == "seed"}
    assert front and all(set(r["cv"]) == ({"lomo"} if r["id"] in scored else set()) for r in rows)


def test_list_all_includes_screened_programs_after_the_evaluated_ones(archive_dir, records):
    programs, _ = records
    assert any(p.stage == "screened" for p in programs), "the small search should screen some children out"
    rows = as_json("list", "--archive", archive_dir, "--all")
    assert [r["id"] for r in rows if r["stage"] == "screened"] and len(rows) == len(programs)
    stages = [r["stage"] == "screened" for r in rows]
    assert stages == sorted(stages)  # every screened-only program after every evaluated one
    quick = [r["quick_loss"] for r in rows if r["stage"] == "screened"]
    assert quick == sorted(quick)


@pytest.mark.parametrize(
    "key,field", [("id", "id"), ("generation", "generation"), ("complexity", "complexity"), ("train", "train_loss")]
)
def test_list_sorts(archive_dir, key, field):
    values = [r[field] for r in as_json("list", "--archive", archive_dir, "--sort", key)]
    assert values == sorted(values)


def test_list_filters_front_cell_and_operator(archive_dir, records):
    programs, _ = records
    front = as_json("list", "--archive", archive_dir, "--front")
    assert {r["id"] for r in front} == {p.id for p in pareto_front(programs)}

    c = cell_of(programs[-1].complexity, programs[-1].n_components)
    in_cell = as_json("list", "--archive", archive_dir, "--all", "--cell", f"{c[0]},{c[1]}")
    assert {r["id"] for r in in_cell} == {p.id for p in programs if cell_of(p.complexity, p.n_components) == c}

    seeds = as_json("list", "--archive", archive_dir, "--operator", "seed")
    assert len(seeds) == 4 and all(r["operator"].startswith("seed:") for r in seeds)  # blackbox is a baseline
    children = [p for p in programs if p.operator != "seed"]
    op = children[0].operator
    matched = as_json("list", "--archive", archive_dir, "--all", "--operator", op)
    assert {r["id"] for r in matched} == {p.id for p in programs if op in p.operator}


def test_list_prints_a_table(archive_dir, records):
    programs, _ = records
    text = invoke("list", "--archive", archive_dir).stdout
    assert "operator" in text and "seed:roofline" in text
    top = min(full(programs), key=lambda p: p.val_loss)
    assert re.search(rf"\b{top.id}\*?\s", text)


# ---- show ----


def test_show_best_has_lineage_to_a_seed_and_the_evaluations(archive_dir, records):
    programs, evaluations = records
    by_id = {p.id: p for p in programs}
    shown = as_json("show", "best", "--archive", archive_dir)
    p = shown["program"]
    top = min(full(programs), key=lambda q: (q.val_loss, q.id))
    assert p["id"] == top.id and p["source"] == top.source and p["constants"] == top.constants

    steps = shown["lineage"]
    assert steps[0]["id"] == top.id
    assert steps[-1]["operator"].startswith("seed:") and steps[-1]["parents"] == []
    for child, parent in zip(steps, steps[1:]):
        assert by_id[child["id"]].parents[0] == parent["id"]
        assert child["operator_detail"] == by_id[child["id"]].operator_detail
    for s in steps:
        assert s["other_parents"] == by_id[s["id"]].parents[1:]

    for split, rows in shown["evaluations"].items():
        stored = {e.experiment: e for e in evaluations[top.id] if e.split == split}
        assert [r["name"] for r in rows] == sorted(stored)
        for r in rows:
            e = stored[r["name"]]
            # JSON has null where a split measures no request (the overloaded run's test window): NaN or None stored
            for shown_value, value in (
                (r["ape"]["e2e"], e.ape_e2e),
                (r["ape"]["ttft"], e.ape_ttft),
                (r["observed"]["e2e_mean_s"], e.observed["e2e_mean_s"]),
                (r["predicted"]["ttft_mean_s"], e.predicted["ttft_mean_s"]),
            ):
                if shown_value is None:
                    assert value is None or math.isnan(value)
                else:
                    assert shown_value == pytest.approx(value)
    assert set(shown["evaluations"]) == {"train", "validate", "test"}


def _hand_built_archive(directory):
    """Seeds 1 and 2, crossover 3 of (1, 2), mutation 4 of 3: a lineage with a second parent."""
    a = Archive(directory, create=True)
    run = a.create_run("hand-built", "0", True, 0, {})

    def prog(i, parents, operator, detail, stage="full"):
        source = f'CONSTANTS = {{"a": {i}.0}}\n\ndef step_time(f, c):\n    return c.a * f.tokens + {i}\n'
        return NewProgram(
            ProgramRecord(
                id=None,
                source_hash=str(i),
                source=source,
                constants={"a": float(i)},
                parents=parents,
                operator=operator,
                operator_detail=detail,
                complexity=5 + i,
                n_components=1,
                components=["tokens"],
                train_loss=10.0 / i,
                val_loss=10.0 / i,
                test_loss=10.0 / i,
                stage=stage,
            )
        )

    stats = GenerationRecord()
    a.write_generation(
        run, 0, 0.0, [prog(1, [], "seed", "roofline", "seed"), prog(2, [], "seed", "blackbox", "seed")], [], [], stats
    )
    a.write_generation(run, 1, 0.0, [prog(3, [1, 2], "crossover", "crossover on step_time")], [], [], stats)
    call = LLMCallRecord(
        model="test/model",
        request_hash="h",
        prompt_tokens=1200,
        completion_tokens=345,
        cost_usd=0.0125,
        latency_s=1.0,
        outcome="ok",
        program_index=0,
    )
    rejected = [RejectionRecord(operator="add_term", parents=[3], rule="duplicate", reason="same structure")] * 2
    a.write_generation(run, 2, 0.0, [prog(4, [3], "llm:test/model", "rewrote step_time")], rejected, [call], stats)
    a.close()


def test_show_follows_the_first_parent_of_a_crossover(tmp_path):
    _hand_built_archive(tmp_path)
    shown = as_json("show", "4", "--archive", tmp_path)
    steps = [(s["id"], s["operator"], s["operator_detail"], s["other_parents"]) for s in shown["lineage"]]
    assert steps == [
        (4, "llm:test/model", "rewrote step_time", []),
        (3, "crossover", "crossover on step_time", [2]),
        (1, "seed:roofline", "roofline", []),
    ]
    assert as_json("show", "best", "--archive", tmp_path)["program"]["id"] == 4
    assert shown["evaluations"] == {}  # nothing stored: no per-experiment table, no crash
    text = invoke("show", "4", "--archive", tmp_path).stdout
    assert "no per-experiment evaluations" in text and "crossover" in text


def test_show_prints_source_lineage_and_tables(archive_dir, records):
    programs, _ = records
    child = next((p for p in programs if p.stage == "full"), programs[0])
    text = invoke("show", child.id, "--archive", archive_dir).stdout
    assert "def step_time(f, c):" in text and "lineage" in text and "fitted constants" in text
    assert "validate split" in text and "test split" in text
    for name in child.constants:
        assert name in text


# ---- pareto ----


def test_show_source_is_a_program_file_that_reproduces_the_archived_losses(archive_dir, records, tmp_path):
    programs, _ = records
    top = min(full(programs), key=lambda q: (q.val_loss, q.id))
    text = invoke("show", "best", "--source", "--archive", archive_dir).stdout
    assert text.startswith(f"# fitted: program #{top.id} of ")
    path = tmp_path / "winner.py"
    path.write_text(text)
    res = CliRunner().invoke(main_app, ["eval", str(path), "--split", "test", "--json"])  # the same synthetic data
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["loss"] == pytest.approx(top.test_loss, rel=1e-9)


def test_pareto_is_non_dominated_and_sorted(archive_dir, records):
    programs, _ = records
    front = as_json("pareto", "--archive", archive_dir)
    assert front
    assert [r["complexity"] for r in front] == sorted(r["complexity"] for r in front)
    vals = [r["val_loss"] for r in front]
    assert all(a > b for a, b in zip(vals, vals[1:]))
    evaluated = [p for p in full(programs) if p.val_loss is not None]
    for r in front:
        assert not any(
            p.val_loss <= r["val_loss"]
            and p.complexity <= r["complexity"]
            and (p.val_loss < r["val_loss"] or p.complexity < r["complexity"])
            for p in evaluated
        )
    ids = {r["id"] for r in front}
    for p in evaluated:  # everything off the front is dominated by a member
        assert p.id in ids or any(r["val_loss"] <= p.val_loss and r["complexity"] <= p.complexity for r in front)


# ---- diff ----


def test_diff_shows_changed_lines_and_loss_deltas(archive_dir, records):
    programs, _ = records
    a, b = sorted(full(programs), key=lambda p: p.val_loss)[:2]
    text = invoke("diff", a.id, b.id, "--archive", archive_dir).stdout
    assert f"--- #{a.id}" in text and f"+++ #{b.id}" in text
    assert re.search(r"^-(?!--)", text, re.M) and re.search(r"^\+(?!\+\+)", text, re.M)
    d = as_json("diff", a.id, b.id, "--archive", archive_dir)
    assert d["metrics"]["val_loss"]["delta"] == pytest.approx(b.val_loss - a.val_loss)
    assert d["metrics"]["complexity"]["delta"] == b.complexity - a.complexity
    assert d["validate_experiments"] and all(e["ape_e2e"]["delta"] is not None for e in d["validate_experiments"])
    same = as_json("diff", a.id, a.id, "--archive", archive_dir)
    assert same["source_diff"] == [] and same["metrics"]["val_loss"]["delta"] == 0


# ---- report ----


def test_report_is_one_self_contained_page(archive_dir, records, tmp_path):
    programs, evaluations = records
    out = tmp_path / "site" / "report.html"
    out.parent.mkdir()  # an output's directory must exist, as for every command
    invoke("report", "--archive", archive_dir, "--out", out)
    assert list(out.parent.iterdir()) == [out]
    html = out.read_text()
    assert not re.search(r"https?://", html)
    assert "<script" not in html.lower() and "<img" not in html.lower()
    assert re.findall(r"<link[^>]*>", html, re.I) == ['<link rel="icon" href="data:,">']  # inline, fetches nothing
    for section in ("pareto", "history", "grid", "best", "distribution"):
        body = re.search(rf'<section id="{section}">(.*?)</section>', html, re.S)
        assert body and "<svg" in body.group(1), section
    for p in programs:
        assert f'id="p{p.id}"' in html
        assert f'href="#p{p.id}"' in html
    top = min(full(programs), key=lambda q: (q.val_loss, q.id))
    tests = [e.experiment for e in evaluations[top.id] if e.split == "test"]
    best_section = re.search(r'<section id="best">(.*?)</section>', html, re.S).group(1)
    assert all(name in best_section for name in tests)


def test_report_refuses_a_directory_as_output(archive_dir, tmp_path):
    res = invoke("report", "--archive", archive_dir, "--out", tmp_path, ok=False)
    assert res.exit_code == 2 and "is a directory" in res.stderr and "Traceback" not in res.output


def test_report_escapes_sources(archive_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(archive_dir, copy)
    db = sqlite3.connect(copy / Archive.FILE)
    evil = '"""<b>x < y</b> & <script>alert(1)</script>"""\n'
    db.execute("UPDATE programs SET source = ? || source WHERE id = 1", (evil,))
    db.commit()
    db.close()
    out = tmp_path / "r.html"
    invoke("report", "--archive", copy, "--out", out)
    html = out.read_text()
    assert "&lt;b&gt;x &lt; y&lt;/b&gt; &amp; &lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>x" not in html and "<script" not in html


def test_report_summarizes_a_run_without_evaluations(tmp_path):
    _hand_built_archive(tmp_path)
    out = tmp_path / "r.html"
    invoke("report", "--archive", tmp_path, "--out", out)
    html = out.read_text()
    summary = re.search(r'<section id="summary">(.*?)</section>', html, re.S).group(1)
    assert "hand-built" in summary and "<dd>2</dd>" in summary  # generations completed
    assert re.search(r"duplicate</td><td>2<", summary) and re.search(r"crossover</td><td>1<", summary)
    assert "llm:test/model" in summary and "1200 prompt + 345 completion" in summary and "$0.0125" in summary
    for section in ("pareto", "history", "grid", "best", "distribution"):
        assert "<svg" in re.search(rf'<section id="{section}">(.*?)</section>', html, re.S).group(1)
    assert "no test-split evaluation" in html  # the empty state, not a crash


# ---- the report in a real browser ----

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
# Chromium as root on a machine with no internet: no sandbox, no background connections.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _need_browser():
    """.ci/run installs Chromium and sets STEPML_REQUIRE_BROWSER=1, so CI fails rather than skips."""
    required = os.environ.get("STEPML_REQUIRE_BROWSER") == "1"
    problem = None
    if not os.path.exists(CHROMIUM):
        problem = "Debian's chromium is not installed (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "playwright is not installed (pip install '.[test]')"
    if problem:
        if required:
            pytest.fail(problem)
        pytest.skip(problem)


@contextmanager
def serve(directory: Path):
    """The report served over HTTP on 127.0.0.1, as a user would open it from a web share."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_report_renders_in_headless_chromium(archive_dir, records, tmp_path):
    _need_browser()
    from playwright.sync_api import sync_playwright

    programs, _ = records
    invoke("report", "--archive", archive_dir, "--out", tmp_path / "report.html")
    errors, requests = [], []
    with serve(tmp_path) as origin, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            response = page.goto(f"{origin}/report.html", wait_until="load")
            assert response is not None and response.ok
            assert page.title()
            for section in ("pareto", "history", "grid", "best", "distribution"):
                svg = page.locator(f"section#{section} svg").first
                box = svg.bounding_box()
                assert box and box["width"] > 200 and box["height"] > 100, (section, box)
                marks = svg.locator("circle, rect, path, polyline, line").count()
                assert marks >= 3, (section, marks)
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            # A program link in the table jumps to its source.
            target = max(p.id for p in programs)
            page.locator(f'section#programs a[href="#p{target}"]').first.click()
            assert page.url.endswith(f"#p{target}")
            assert page.locator(f"#p{target} pre").is_visible()
            assert page.evaluate(f"document.getElementById('p{target}').getBoundingClientRect().top") < 900
        finally:
            browser.close()
    assert errors == []
    assert all(url.startswith(origin) for url in requests), requests  # nothing fetched from elsewhere
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- errors and the default archive ----


def one_line_error(res, text: str) -> None:
    assert res.exit_code == 2, res.output
    assert text in res.stderr and res.stderr.strip().count("\n") == 0, res.stderr


def test_unknown_program_is_a_one_line_error(archive_dir):
    one_line_error(invoke("show", "987654", "--archive", archive_dir, ok=False), "program 987654 does not exist")
    one_line_error(invoke("diff", "1", "987654", "--archive", archive_dir, ok=False), "program 987654 does not exist")
    one_line_error(invoke("show", "first", "--archive", archive_dir, ok=False), "not a program id")


def test_corrupt_database_is_a_one_line_error(tmp_path):
    (tmp_path / Archive.FILE).write_bytes(b"not sqlite at all" * 300)
    for cmd in (["list"], ["show", "best"], ["pareto"], ["diff", "1", "2"], ["report", "--out", tmp_path / "r.html"]):
        one_line_error(invoke(*cmd, "--archive", tmp_path, ok=False), "not a readable archive")
    assert not (tmp_path / "r.html").exists()


def test_empty_archive_is_a_one_line_error(tmp_path):
    Archive(tmp_path, create=True).close()
    for cmd in (["list"], ["show", "best"], ["pareto"], ["report", "--out", tmp_path / "r.html"]):
        one_line_error(invoke(*cmd, "--archive", tmp_path, ok=False), "holds no run yet")


def test_missing_archive_is_a_one_line_error(tmp_path, monkeypatch):
    one_line_error(invoke("list", "--archive", tmp_path, ok=False), "no archive here")
    monkeypatch.chdir(tmp_path)
    one_line_error(invoke("pareto", ok=False), "no archive found under runs")
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    one_line_error(invoke("report", ok=False), "no archive found under runs")


def test_default_archive_is_the_most_recently_written_run(archive_dir, records, tmp_path, monkeypatch):
    programs, _ = records
    runs = tmp_path / "runs"
    for name, mtime in (("old", 1_000_000), ("new", 2_000_000)):
        shutil.copytree(archive_dir, runs / name)
        for f in (runs / name).iterdir():
            os.utime(f, (mtime, mtime))
    monkeypatch.chdir(tmp_path)
    assert latest_archive_dir().name == "new"
    (runs / "new" / Archive.FILE).unlink()
    assert latest_archive_dir().name == "old"
    assert {r["id"] for r in as_json("list", "--all")} == {p.id for p in programs}
    shutil.rmtree(runs)
    with pytest.raises(BrowseError):
        latest_archive_dir()


def test_browsing_works_while_a_run_holds_the_write_lock(archive_dir, records):
    """A search writes each generation in one transaction; browsing must neither wait for it nor write."""
    programs, _ = records
    writer = sqlite3.connect(archive_dir / Archive.FILE, isolation_level=None, timeout=0)
    writer.execute("BEGIN IMMEDIATE")
    try:
        assert {r["id"] for r in as_json("list", "--all", "--archive", archive_dir)} == {p.id for p in programs}
        invoke("show", "best", "--archive", archive_dir)
    finally:
        writer.execute("ROLLBACK")
        writer.close()


# ---- history ----


def test_history_has_the_runs_pace_and_every_improvement_with_the_program_that_made_it(archive_dir, records):
    programs, _ = records
    a = Archive.open(archive_dir)
    gens = a.generations(a.run().id)
    a.close()
    h = as_json("history", "--archive", archive_dir, "--every", 2)
    assert h["generations"] == gens[-1].generation and h["wall_s"] == pytest.approx(sum(g.seconds for g in gens))
    assert h["generation0_s"] == pytest.approx(gens[0].seconds)
    later = [g.seconds for g in gens[1:]]
    assert h["per_hour"] == pytest.approx(3600 * len(later) / sum(later))
    shown = [r["generation"] for r in h["rows"]]
    improving = [
        g.generation for i, g in enumerate(gens) if g.best_val < min([math.inf] + [x.best_val for x in gens[:i]])
    ]
    assert set(shown) == {g.generation for g in gens if g.generation % 2 == 0} | set(improving) | {gens[-1].generation}
    for r in h["rows"]:
        assert r["improved"] == (r["generation"] in improving)
        if r["improved"]:  # the program that set the new best was made in that generation and has that loss
            made = next(p for p in programs if p.id == r["new_best"])
            assert made.generation == r["generation"] and made.val_loss == pytest.approx(r["best_val"])
    assert [r["elapsed_s"] for r in h["rows"]] == sorted(r["elapsed_s"] for r in h["rows"])
    table = invoke("history", "--archive", archive_dir).stdout
    assert f"{len(gens)} generations in" in table and "best val" in table


def test_history_refuses_a_zero_step(archive_dir):
    from conftest import only_error_line

    only_error_line(invoke("history", "--archive", archive_dir, "--every", 0, ok=False), "--every")


def test_a_refit_is_told_from_a_new_structure(tmp_path, archive_dir, records):
    """A program of an older one's structure (the same functions, constant names, bounds and priors,
    other values: a `constants` child) is listed, shown and summarized as a refit of the oldest."""
    from stepml_evolve.archive.records import refit_of
    from stepml_evolve.evolve.cli.tables import run_summary_tables

    programs, _ = records
    refits = refit_of(programs)
    first: dict[str, int] = {}
    for p in sorted(programs, key=lambda p: p.id):
        assert refits.get(p.id) == first.get(p.source_hash), p.id
        first.setdefault(p.source_hash, p.id)
    listed = {r["id"]: r["refit_of"] for r in as_json("list", "--all", "--archive", archive_dir)}
    assert listed == {p.id: refits.get(p.id) for p in programs}

    a = Archive(tmp_path, create=True)
    run = a.create_run("hand-built", "0", True, 0, {})
    source = 'CONSTANTS = {"a": 1.0}\n\ndef step_time(f, c):\n    return c.a * f.tokens\n'

    def prog(loss, operator, parents):
        record = ProgramRecord(
            id=None, source_hash="same", source=source, constants={"a": loss}, parents=parents, operator=operator,
            operator_detail="roofline" if operator == "seed" else "", complexity=5, n_components=1,
            components=["tokens"], train_loss=loss, val_loss=loss, test_loss=loss,
            stage="seed" if operator == "seed" else "full",
        )  # fmt: skip
        return NewProgram(record)

    a.write_generation(run, 0, 0.0, [prog(2.0, "seed", [])], [], [], GenerationRecord())
    a.write_generation(run, 1, 0.0, [prog(1.0, "constants", [1])], [], [], GenerationRecord())
    a.close()
    assert [(r["id"], r["refit_of"]) for r in as_json("list", "--archive", tmp_path)] == [(2, 1), (1, None)]
    assert "constants (refit #1)" in invoke("list", "--archive", tmp_path).stdout
    assert as_json("show", "best", "--archive", tmp_path)["program"]["refit_of"] == 1
    best = {"id": 2, "generation": 1, "operator": "constants", "refit_of": 1, "val_loss": 1.0, "test_loss": 1.0}
    summary = {
        "best": {**best, "complexity": 5, "test": []},
        "front": [],
        "deployed": {**best, "rule": "guarded", "why": "w"},
    }
    headline, *_, deployed = run_summary_tables(summary)
    assert "(generation 1, constants, a refit of #1)" in headline and "#2, a refit of #1; w" in deployed
