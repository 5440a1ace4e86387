"""`evolve archive report`: an archive's self-contained HTML report (evolve.browse.html_report) written to a file."""

from __future__ import annotations

from pathlib import Path

from stepml_evolve.archive.access import opened
from stepml_evolve.evaluator.outputs import check_outputs, write_atomic
from stepml_evolve.evolve.browse.html_report import render


def write_report(archive_dir: Path | None, out: Path) -> Path:
    """Render the report of the archive in `archive_dir` (default: the newest under runs/) into
    `out` (checked first, as every output is: its directory must exist); returns the archive's directory."""
    check_outputs([out])
    with opened(archive_dir) as archive:
        write_atomic(out, render(archive))
        return archive.dir
