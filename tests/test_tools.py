"""The measurement scripts in tools/: each prints its usage with `--help`, every script the docs
cite is in the repository, and tools/README.md indexes every script."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
DOCS = ROOT / "docs"
SCRIPTS = sorted(path.name for path in TOOLS.glob("*.py"))

CITED_TOOL = re.compile(r"tools/([A-Za-z0-9_]+\.py)")
RUN_SCRIPT = re.compile(r"python3?\s+([^\s`'\"|]+\.py)\b")


def _doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_scripts_found():
    assert len(SCRIPTS) >= 11, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script):
    done = subprocess.run(
        [sys.executable, str(TOOLS / script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"usage: {script}" in done.stdout, done.stdout[:2000]
    assert "--help" in done.stdout


def test_cited_tools_exist_and_are_indexed():
    index = (TOOLS / "README.md").read_text()
    cited: dict[str, set[str]] = {}
    for page in _doc_pages():
        for name in CITED_TOOL.findall(page.read_text()):
            cited.setdefault(name, set()).add(str(page.relative_to(ROOT)))
    assert cited, "the docs cite no tools/ script: has the history moved?"
    missing = {name: sorted(pages) for name, pages in cited.items() if not (TOOLS / name).is_file()}
    assert not missing, f"cited but not in tools/: {missing}"
    unindexed = sorted(name for name in cited if f"`{name}`" not in index)
    assert not unindexed, f"cited but not listed in tools/README.md: {unindexed}"


def test_every_script_is_indexed():
    index = (TOOLS / "README.md").read_text()
    assert [name for name in SCRIPTS if f"`{name}`" not in index] == []


def test_scripts_the_docs_run_exist():
    """`python X.py` in the docs names a file of the repository (the history once cited scripts
    that were never committed)."""
    missing = sorted(
        {
            f"{page.relative_to(ROOT)}: {path}"
            for page in _doc_pages()
            for path in RUN_SCRIPT.findall(page.read_text())
            if not (ROOT / path).is_file()
        }
    )
    assert not missing, missing
