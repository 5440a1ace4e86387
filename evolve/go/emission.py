"""What `evolve emit-go` emits: the program (a program file, or an archive's program by id or by a
deployment rule of archive/deployment.py, RULES) with its header, written as gofmt-clean Go and,
optionally, its Go parity test (`--blis`, which installs both into a BLIS checkout, is
evolve/blis/install.py).

The rules (evolve.deploy.rules.choose) rank by the lowest CV loss when any program of the run has
one (the protocol most programs have scores of; ties: lomo, else lowo), else by validation loss;
DEFAULT_RULE (guarded) is the default. The Go file's header names the rule, the losses and the
program's CV scores."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from stepml_evolve.archive.access import cv_header, fitted_header, opened, resolve
from stepml_evolve.evaluator.choices import PHYSICS_MODES
from stepml_evolve.evaluator.dsl import Program, load_program
from stepml_evolve.evaluator.errors import cut
from stepml_evolve.evaluator.fit.fitted_header import header_lines
from stepml_evolve.evaluator.outputs import check_outputs, write_atomic
from stepml_evolve.evaluator.physics.rules import physics_problems
from stepml_evolve.evolve.deploy.pins import deployed_program, pins_text
from stepml_evolve.evolve.deploy.rules import DEFAULT_JUDGE, MARGIN_RULES, RULES, Choice, choose
from stepml_evolve.evolve.go.parity import DEFAULT_SAMPLES
from stepml_evolve.evolve.go.parity import samples as parity_samples
from stepml_evolve.evolve.go.source import DEFAULT_NAME, DEFAULT_TARGET, EmitError, go_source, go_test_source, gofmt
from stepml_evolve.evolve.go.source import target as target_of


@dataclass(frozen=True)
class Emission:
    """The program to emit, the labelled fields of the Go file's header, the rule's choice (if a
    rule chose it), and whether the Go holds every step to its physical floor."""

    program: Program
    header: dict[str, str]
    choice: Choice | None = None
    floor: bool = True


def _held_to_physics(emission: Emission, spec: str, physics: str) -> Emission:
    """The emission under `physics`: "check" refuses a program that breaks a rule of
    evaluator/physics (one line: which rule, where) and has the Go panic at a step below its floor;
    "off" emits it as it is, with only a step above 0 required."""
    if physics not in PHYSICS_MODES:
        raise EmitError(f"--physics must be one of {', '.join(PHYSICS_MODES)}, not {physics!r}")
    if physics == "off":
        return replace(emission, floor=False)
    if problems := physics_problems(emission.program):
        rule, message = problems[0]
        what = f"#{emission.choice.program.id} (rule {emission.choice.rule})" if emission.choice else cut(spec)
        raise EmitError(
            f"{what}: --physics check refuses it [{rule}]: {message}; nothing written (--physics off emits it "
            "without the floor's guard)"
        )
    return emission


def _is_file_spec(spec: str) -> bool:
    """A program file's path: a .py name, a path (a rule or an id holds no "/"), or an existing file
    (a device too: reading it says what it is, where a rule's lookup would look for an archive)."""
    try:
        return spec.endswith(".py") or "/" in spec or os.sep in spec or Path(spec).is_file()
    except OSError:  # a name too long for the file system: no file, and no rule or id either
        return False


def choose_for_emission(
    spec: str,
    archive_dir: Path | None,
    within: float | None = None,
    physics: str = PHYSICS_MODES[0],
    judge: str | None = None,
) -> Emission:
    """The program named by `spec`: a .py file, a deployment rule (RULES) or an id of the archive,
    held to `physics` (`_held_to_physics`). `within` (percent) goes with the rules that have a margin
    (MARGIN_RULES), `judge` (JUDGES; default DEFAULT_JUDGE) with every rule."""
    return _held_to_physics(_chosen(spec, archive_dir, within, judge), spec, physics)


def _chosen(spec: str, archive_dir: Path | None, within: float | None, judge: str | None) -> Emission:
    rule = spec.strip().lower()
    if within is not None and (rule not in MARGIN_RULES or _is_file_spec(spec)):
        raise EmitError(f"--within goes with the rules {', '.join(MARGIN_RULES)} only, not with {spec!r}")
    if judge is not None and (rule not in RULES or _is_file_spec(spec)):
        raise EmitError(f"--judge goes with the rules {', '.join(RULES)} only, not with {spec!r}")
    path = Path(spec)
    if _is_file_spec(spec):
        if not os.path.lexists(path):  # (False for a name too long, too)
            raise EmitError(f"{cut(spec)}: no such program file")
        program = load_program(path)
        fitted = header_lines(program.source)
        # the file's name only: the Go file goes into other people's checkouts, not this machine's paths
        return Emission(program, {"program": path.name, **({"fitted": " / ".join(fitted)} if fitted else {})})
    with opened(archive_dir) as archive:
        choice = choose(archive, rule, within, judge=judge or DEFAULT_JUDGE) if rule in RULES else None
        record = choice.program if choice else resolve(archive, spec)
        header = fitted_header(archive, record).labelled()
        scores = archive.cv_scores(record.id)
        program, pins = deployed_program(archive, record)
    if choice:
        header["chosen by"] = choice.describe()
    if pins:
        header["constants"] = pins_text(pins)
    header.update(cv_header(scores))
    return Emission(program, header, choice)


def program_for_emission(
    spec: str, archive_dir: Path | None, within: float | None = None, physics: str = PHYSICS_MODES[0]
) -> tuple[Program, dict[str, str]]:
    """The program named by `spec` (a .py file, or `best`/`simplest`/an id in the archive) and the
    header of the Go file: the file and its `# fitted:` header on one line, or the archived program,
    its data, seed and losses (and, for a rule, which rule chose it and why)."""
    emission = choose_for_emission(spec, archive_dir, within, physics)
    return emission.program, emission.header


def emitted_sources(
    spec: str,
    archive_dir: Path | None,
    target: str = DEFAULT_TARGET,
    name: str = DEFAULT_NAME,
    samples: int | None = DEFAULT_SAMPLES,
    within: float | None = None,
    physics: str = PHYSICS_MODES[0],
) -> tuple[str, str | None]:
    """The gofmt-clean Go model of `spec` and, unless samples is None, its Go test against Python
    on `samples` batches."""
    return _sources(choose_for_emission(spec, archive_dir, within, physics), target, name, samples)


def _sources(emission: Emission, target: str, name: str, samples: int | None) -> tuple[str, str | None]:
    source = gofmt(
        go_source(emission.program, name=name, target_name=target, header=emission.header, floor=emission.floor)
    )
    test_source = (
        gofmt(go_test_source(name, parity_samples(emission.program, samples, floor=emission.floor), target))
        if samples is not None
        else None
    )
    return source, test_source


def emit_program(
    spec: str,
    archive_dir: Path | None,
    out: Path,
    test_out: Path | None = None,
    target: str = DEFAULT_TARGET,
    name: str = DEFAULT_NAME,
    samples: int = DEFAULT_SAMPLES,
    within: float | None = None,
    physics: str = PHYSICS_MODES[0],
    judge: str | None = None,
) -> Choice | None:
    """Write `out` (and `test_out`, the Go test against Python on `samples` batches); paths checked
    first. Returns the rule's choice when a rule (`best`, `simplest`) picked the program."""
    check_outputs([out] + ([test_out] if test_out else []), inputs=[Path(spec)] if spec.endswith(".py") else [])
    target_of(target)
    emission = choose_for_emission(spec, archive_dir, within, physics, judge)
    source, test_source = _sources(emission, target, name, samples if test_out else None)
    write_atomic(out, source)
    if test_out:
        write_atomic(test_out, test_source)
    return emission.choice
