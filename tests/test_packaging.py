"""Seeds and prompts are package data: found after a regular (non-editable) install."""
from __future__ import annotations

from importlib import metadata

import pytest

from seeds import seed_paths


def test_seed_files_are_found_through_the_package():
    names = {p.stem for p in seed_paths()}
    assert {"blackbox", "roofline", "phase_decomposed", "regime_switch", "trained_physics"} <= names
    assert all(p.is_file() for p in seed_paths())


def test_installed_distribution_ships_seeds_and_prompts():
    files = [str(f) for f in (metadata.files("stepml-evolve") or [])]
    if not any(f.startswith("seeds/") for f in files):
        pytest.skip("editable install: package data is read from the source tree")
    assert sum(f.startswith("seeds/") and f.endswith(".py") for f in files) >= 6
    assert any(f.startswith("prompts/") and f.endswith(".j2") for f in files)
