"""Every current figure is stated once (issue 65, item 3): docs/results/index.md is the one table
of current figures, each row with its date, code and command; the README's figures are copied from
it by tools/readme_figures.py and a figure that differs fails; no other page holds a
current-figures section or a table of figures."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

INDEX = "docs/results/index.md"
HISTORY = "docs/HISTORY.md"
# A section of current figures: a heading or an admonition title that says so.
CURRENT = re.compile(r"current figures?|figures? (?:of )?today|today's figures?", re.IGNORECASE)
TITLE = re.compile(r'^(?:#{1,6}\s|!!!\s+\w+\s+")')
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


readme_figures = _tool("readme_figures")


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of a Markdown page, the fenced code blocks left out."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in CELL_SPLIT.split(line.strip().strip("|"))]


def _tables(lines: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    tables: list[list[tuple[int, str]]] = []
    previous = None
    for number, line in lines:
        if line.startswith("|"):
            if previous is None or not previous.startswith("|"):
                tables.append([])
            tables[-1].append((number, line))
        previous = line
    return tables


def figures_stated_elsewhere(root: Path) -> list[str]:
    """Where a current figure is stated outside the index. The rule:

    1. no page but the index (README.md and every page under docs/) has a heading or an
       admonition title naming current figures ("Current figures", "figures today", ...);
    2. no page under docs/ but the index and the history has a table with a `figure` column;
    3. every table of the README lies between its `<!-- figures:begin ... -->` and
       `<!-- figures:end -->` markers (the block tools/readme_figures.py writes).
    """
    problems = []
    pages = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    for page in pages:
        name = page.relative_to(root).as_posix()
        if name == INDEX:
            continue
        lines = _prose(page)
        for number, line in lines:
            if TITLE.match(line) and CURRENT.search(line):
                problems.append(f"{name}:{number}: a section of current figures: {line.strip()}")
        if name not in (HISTORY, "README.md"):  # the README's tables: rule 3
            for table in _tables(lines):
                number, header = table[0]
                if any(cell.lower() == "figure" for cell in _cells(header)):
                    problems.append(f"{name}:{number}: a table of figures: {header.strip()[:80]}")
    inside, begun = set(), None
    for number, line in _prose(root / "README.md"):
        if readme_figures.BEGIN.match(line):
            begun = number
        elif line == readme_figures.END:
            begun = None
        elif begun is not None:
            inside.add(number)
    for table in _tables(_prose(root / "README.md")):
        number, header = table[0]
        if number not in inside:
            problems.append(f"README.md:{number}: a table outside the figures block: {header.strip()[:80]}")
    return problems


def test_a_current_figure_is_stated_only_in_the_index():
    problems = figures_stated_elsewhere(ROOT)
    assert not problems, "current figures belong in docs/results/index.md:\n" + "\n".join(problems)


def test_the_rule_finds_a_second_statement(tmp_path):
    """The rule fails on what the tree held before issue 65: a "Current figures" section on a
    topic page, a table of figures there, a README table outside the generated block."""
    for name in ("README.md", INDEX):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    assert figures_stated_elsewhere(tmp_path) == []
    page = tmp_path / "docs" / "results" / "speed.md"
    page.write_text("# Speed\n\n## Current figures\n\n| figure | value |\n|---|---|\n| wall | 1.82 h |\n")
    with (tmp_path / "README.md").open("a") as readme:
        readme.write("\n| what | figure |\n|---|---|\n| speed | 2.09 h |\n")
    problems = figures_stated_elsewhere(tmp_path)
    assert [p.split(": ")[0] for p in problems] == [
        "docs/results/speed.md:3",
        "docs/results/speed.md:5",
        "README.md:{}".format(len((tmp_path / "README.md").read_text().splitlines()) - 2),
    ], problems


def test_every_row_has_its_date_code_command_and_page():
    table = readme_figures.read_index(ROOT / INDEX)
    header = _cells(table.header[0])
    assert header == ["topic", "figure", "measured", "command", "page"]
    assert len(table.rows) >= 10
    for row, line in table.rows.items():
        topic, figure, measured, command, page = _cells(line)
        assert figure, row
        assert DATE.search(measured) and re.search(r"\b[0-9a-f]{7}\b|issue \d+", measured), (row, measured)
        assert command.startswith("`"), (row, command)
        assert re.search(r"\]\([^)]+\)", page), (row, page)


def test_topic_pages_link_to_their_rows():
    ids = set(readme_figures.read_index(ROOT / INDEX).rows)
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        if page.name == "index.md":
            continue
        linked = set(re.findall(r"\]\(index\.md#([A-Za-z0-9_-]+)\)", page.read_text()))
        assert linked, f"{page.name} links to none of its rows in index.md"
        assert linked <= ids, f"{page.name} links to rows index.md does not hold: {sorted(linked - ids)}"


def test_the_readme_shows_the_index_s_figures():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "readme_figures.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("where", ["README.md", INDEX])
def test_a_figure_that_differs_fails(tmp_path, where):
    readme, index = tmp_path / "README.md", tmp_path / "docs" / "results" / "index.md"
    index.parent.mkdir(parents=True)
    shutil.copy(ROOT / "README.md", readme)
    shutil.copy(ROOT / INDEX, index)
    edited = readme if where == "README.md" else index
    text = edited.read_text()
    assert "deploys #400" in text
    edited.write_text(text.replace("deploys #400", "deploys #401", 1))
    args = ["--readme", str(readme), "--index", str(index)]
    assert readme_figures.main(["--check", *args]) == 1
    assert readme_figures.main(args) == 0  # the default rewrites the README from the index
    assert readme_figures.main(["--check", *args]) == 0
    assert ("deploys #401" in readme.read_text()) == (where != "README.md")


def test_the_check_names_the_row(tmp_path, capsys):
    readme, index = tmp_path / "README.md", tmp_path / "docs" / "results" / "index.md"
    index.parent.mkdir(parents=True)
    shutil.copy(ROOT / "README.md", readme)
    shutil.copy(ROOT / INDEX, index)
    index.write_text(index.read_text().replace("deploys #960", "deploys #961", 1))
    assert readme_figures.main(["--check", "--readme", str(readme), "--index", str(index)]) == 1
    assert "row 'search-cv'" in capsys.readouterr().err
