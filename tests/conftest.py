"""Shared fixtures. Real data lives beside the project in ../shared/data/replay (CI always has
it); tests that need it skip with a clear reason where it is absent."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = Path(os.environ.get("STEPML_REAL_DATA", ROOT.parent / "shared" / "data" / "replay"))
HAVE_REAL_DATA = (REAL_DATA / "20260217-155451-llama-2-7b-tp1-codegen" / "requests.json").is_file()

needs_real_data = pytest.mark.skipif(
    not HAVE_REAL_DATA, reason=f"real replay data not found at {REAL_DATA} (set STEPML_REAL_DATA to its directory)")


@pytest.fixture(scope="session")
def real_data() -> Path:
    if not HAVE_REAL_DATA:
        pytest.skip(f"real replay data not found at {REAL_DATA} (set STEPML_REAL_DATA to its directory)")
    return REAL_DATA


@pytest.fixture(scope="session")
def real_experiments(real_data):
    from evaluator.experiments import load_experiments

    good, bad = load_experiments(real_data)
    assert not bad, bad
    return good


@pytest.fixture(scope="session")
def synthetic():
    from evaluator.datasets import load_data

    return load_data(None)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Keep the synthetic sample and caches of the test session out of the user's home."""
    if "STEPML_CACHE" not in os.environ:
        os.environ["STEPML_CACHE"] = str(tmp_path_factory.mktemp("stepml-cache"))
    yield
