"""`evolve emit-go`: the program to emit (a program file, or an archive's program by id or
`best`) with its header, written as gofmt-clean Go and, optionally, its Go parity test (`--blis`,
which installs both into a BLIS checkout, is evolve/blis_install.py)."""
from __future__ import annotations

from pathlib import Path

from archive.browse import fitted_header, opened, resolve
from evaluator.dsl import Program, load_program, parse_program
from evaluator.fitted_header import header_lines

from .emit_go import DEFAULT_NAME, DEFAULT_TARGET, EmitError, emit_go, emit_go_test, gofmt
from .emit_go import target as target_of
from .go_parity import DEFAULT_SAMPLES
from .go_parity import samples as parity_samples
from .outputs import check_outputs, write_atomic


def program_for_emission(spec: str, archive_dir: Path | None) -> tuple[Program, dict[str, str]]:
    """The program named by `spec` (a .py file, or `best`/an id in the archive) and the header of
    the Go file: the file and its `# fitted:` header on one line, or the archived program, its
    data, seed and losses."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise EmitError(f"{path}: no such program file")
        program = load_program(path)
        fitted = header_lines(program.source)
        # the file's name only: the Go file goes into other people's checkouts, not this machine's paths
        return program, {"program": path.name, **({"fitted": " / ".join(fitted)} if fitted else {})}
    with opened(archive_dir) as archive:
        record = resolve(archive, spec)
        header = fitted_header(archive, record)
    return parse_program(record.source), header.labelled()


def emitted_sources(spec: str, archive_dir: Path | None, target: str = DEFAULT_TARGET, name: str = DEFAULT_NAME,
                    samples: int | None = DEFAULT_SAMPLES) -> tuple[str, str | None]:
    """The gofmt-clean Go model of `spec` and, unless samples is None, its Go test against Python
    on `samples` batches."""
    program, header = program_for_emission(spec, archive_dir)
    source = gofmt(emit_go(program, name=name, target_name=target, header=header))
    test_source = gofmt(emit_go_test(name, parity_samples(program, samples), target)) if samples is not None else None
    return source, test_source


def emit_program(spec: str, archive_dir: Path | None, out: Path, test_out: Path | None = None, target: str = DEFAULT_TARGET,
                 name: str = DEFAULT_NAME, samples: int = DEFAULT_SAMPLES) -> None:
    """Write `out` (and `test_out`, the Go test against Python on `samples` batches); paths checked first."""
    check_outputs([out] + ([test_out] if test_out else []), inputs=[Path(spec)] if spec.endswith(".py") else [])
    target_of(target)
    source, test_source = emitted_sources(spec, archive_dir, target, name, samples if test_out else None)
    write_atomic(out, source)
    if test_out:
        write_atomic(test_out, test_source)
