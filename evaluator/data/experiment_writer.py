"""Writing one experiment directory (../shared/data/README.md), the counterpart of
experiment_reader.py: the one writer behind the importers and the generated experiments
(known_truth). Each caller makes the files' contents; this writes them whole or not at all."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from stepml_evolve.evaluator.outputs import check_output_dir


def write_experiment(out: Path, files: dict[str, str], check: Callable[[Path], None] | None = None) -> Path:
    """Write `files` (name -> text) as the experiment directory `out`, a new name or an empty
    directory: into a temporary directory beside it, handed to `check` (which raises to refuse it)
    when given, then renamed to `out`. Anything that fails leaves `out` as it was and no temporary
    directory. A path `out` may not take is an OutputError (outputs.py); a write the disk refuses
    stays an OSError, naming the file as it would have been named in `out`, so that a caller
    writing a whole directory of experiments reports it as its own (outputs.directory_written_whole)."""
    out = Path(out)
    check_output_dir(out)
    try:
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    except OSError as e:
        e.filename = str(out)
        raise
    try:
        for name, text in files.items():
            (tmp / name).write_text(text)
        if check is not None:
            check(tmp)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes 0700; give the directory the mode mkdir would
        os.rename(tmp, out)  # rename(2) replaces an empty directory in one step: a failure leaves it there
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.filename:
            e.filename = str(e.filename).replace(str(tmp), str(out), 1)
        raise
    return out
