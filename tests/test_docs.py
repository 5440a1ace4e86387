"""The docs site (mkdocs.yml, docs/) builds without a warning, holds a page for every command the
command line has, generated from it, and the README stays a front door a newcomer reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import yaml
from conftest import ROOT

from stepml_evolve.evolve.cli.reference import command_pages


def _nav_pages(nav) -> set[str]:
    out = set()
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            out |= _nav_pages(value) if isinstance(value, list) else {value}
    return out


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fit = (tmp_path / "site" / "commands" / "fit" / "index.html").read_text()
    assert "--physics" in fit and "--no-profile" in fit  # generated from the command line
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "open_archive" in api and "identifiability" in api  # from the API's docstrings


def test_every_command_has_a_page_in_the_site_s_navigation():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # it holds !!python tags
    nav = _nav_pages(config["nav"])
    missing = [p.name for p in command_pages() if f"commands/{p.slug}.md" not in nav]
    assert not missing, f"add to mkdocs.yml's nav: {missing}"
    notes = {p.stem for p in (ROOT / "docs" / "commands" / "notes").glob("*.md")}
    assert notes <= {p.slug for p in command_pages()}, "notes for a command that does not exist"


def test_a_command_page_says_what_evolve_help_says():
    fit = next(p for p in command_pages() if p.slug == "fit")
    assert "Fit PROGRAM's constants on the train split" in fit.markdown
    assert "| `--physics` | `check` \\| `off` | `check` |" in fit.markdown


def test_the_readme_is_a_front_door():
    """Short enough to read in five minutes, opening with the two commands CI runs, and every
    page it links to exists."""
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
    first_block = readme.split("```")[1].strip().splitlines()
    assert len(first_block) == 2 and "evolve run" in first_block[0] and "pytest" in first_block[1]
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links to the docs"
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
