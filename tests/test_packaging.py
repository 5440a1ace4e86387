"""Seeds, prompts and the worlds' laws are package data: found after a regular (non-editable) install; the wheel
installs one top-level name, stepml_evolve, and nothing generic (archive, evaluator, ...)."""

from __future__ import annotations

from importlib import metadata

import pytest

from stepml_evolve.seeds import baseline_paths, seed_paths


def test_seed_and_baseline_files_are_found_through_the_package():
    names = {p.stem for p in seed_paths()}
    assert {"roofline", "phase_decomposed", "regime_switch", "trained_physics"} <= names
    assert "blackbox" not in names  # a baseline, never a seed
    assert [p.stem for p in baseline_paths()] == ["blackbox"]
    assert all(p.is_file() for p in seed_paths() + baseline_paths())


def _installed_files() -> list[str]:
    files = [str(f) for f in (metadata.files("stepml-evolve") or [])]
    if not any(f.startswith("stepml_evolve/seeds/") for f in files):
        pytest.skip("editable install: package data is read from the source tree")
    return files


def test_installed_distribution_ships_seeds_prompts_and_templates():
    files = _installed_files()
    assert sum(f.startswith("stepml_evolve/seeds/") and f.endswith(".py") for f in files) >= 6
    assert any(f.startswith("stepml_evolve/prompts/") and f.endswith(".j2") for f in files)
    assert sum(f.startswith("stepml_evolve/worlds/") and f.endswith(".py") for f in files) >= 9  # the worlds' laws
    assert any(f.startswith("stepml_evolve/evolve/go/templates/") for f in files)
    assert "stepml_evolve/evaluator/hardware/catalog.yaml" in files


def test_the_wheel_installs_one_top_level_name():
    tops = {
        f.split("/")[0]
        for f in _installed_files()
        if not f.startswith("..") and ".dist-info" not in f.split("/")[0] and "__pycache__" not in f
    }
    assert tops == {"stepml_evolve"}, tops


def test_the_installed_package_is_what_a_command_run_from_the_checkout_imports():
    """No folder of the checkout shadows the installed package when the working directory is the
    checkout (python -m puts it first on sys.path): the commands work from there."""
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "stepml_evolve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "Usage" in proc.stdout, proc.stderr[-2000:]


def test_every_package_of_the_source_tree_is_installed():
    """pyproject.toml lists the packages by hand: a subpackage left out of it would import from a
    checkout and fail after `pip install .`."""
    from conftest import ROOT

    files = set(_installed_files())
    for folder in ("evaluator", "archive", "evolve"):
        for init in (ROOT / folder).rglob("__init__.py"):
            installed = "stepml_evolve/" + init.relative_to(ROOT).as_posix()
            assert installed in files, f"{init.parent.relative_to(ROOT)} is not installed: add it to pyproject.toml"


def test_pyproject_lists_every_package_of_the_source_tree():
    """The same rule read from pyproject.toml itself, so it holds (and fails) on an editable install
    too, where the installed files above are not there to read."""
    import tomllib

    from conftest import ROOT

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {folder: name for name, folder in setup["package-dir"].items()}
    missing = []
    for folder, name in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            package = ".".join((name, *parts))
            if package not in setup["packages"]:
                missing.append(package)
    assert not missing, f"add to pyproject.toml's packages: {missing}"
