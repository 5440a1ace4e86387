"""The deployed child's constants the training data cannot tell from its seed's, pinned back to the
seed's values at the run's end (evaluator/fit/pinning.py), kept in the run's summary under "pins",
and the constants emit-go and blis-compare deploy the child with.

The pins change no archived program: `evolve archive show` lists the fitted constants beside the
deployed ones, and a program file (`show --source`) keeps the fitted ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepml_evolve.archive.access import BrowseError
from stepml_evolve.archive.records import ProgramRecord
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.dsl import Program, parse_program
from stepml_evolve.evaluator.say import Say, quiet

from .choices import DEFAULT_RULE
from .rules import choose, own_seed

if TYPE_CHECKING:
    from stepml_evolve.evaluator.datasets import LoadedData
    from stepml_evolve.evaluator.fit.config import FitConfig
    from stepml_evolve.evaluator.scoring.pool import ReplayPool


def pins_of(archive: Archive, record: ProgramRecord) -> dict | None:
    """The pins the run's end stored for `record` (Pinning.to_json plus its seed's id), if any
    constant was pinned."""
    run = archive.run(record.run_id)
    pins = ((run.summary if run else None) or {}).get("pins", {}).get(str(record.id))
    return pins if pins and pins.get("pinned") else None


def deployed_program(archive: Archive, record: ProgramRecord) -> tuple[Program, dict | None]:
    """`record`'s program with the constants it is deployed with (its pinned ones at its seed's
    values), and its pins (None: deployed as fitted)."""
    program = parse_program(record.source)
    pins = pins_of(archive, record)
    return (program.with_constants(pins["constants"]), pins) if pins else (program, None)


def pins_text(pins: dict) -> str:
    """One line: which constants are pinned to which seed's fit, and what it costs on the train split."""
    names = ", ".join(pins["pinned"])
    return (
        f"{names} pinned to seed #{pins['seed']}'s fit (the training data do not tell them apart: train loss "
        f"{pins['fitted_loss']:.4g} fitted, {pins['loss']:.4g} pinned, within {pins['tolerance']:g}%)"
    )


def pin_deployed(
    archive: Archive,
    run_id: int,
    loaded: LoadedData,
    pool: ReplayPool,
    config: FitConfig,
    summary: dict,
    say: Say = quiet,
) -> dict:
    """If the default rule deploys a child, pin the constants its training data cannot tell from its
    seed's (`config`: the run's FitConfig, for the split, objective and floor) and keep them in the
    summary (stored); a child already pinned (a resumed run's end) is not pinned again."""
    try:
        pick = choose(archive, DEFAULT_RULE).program
    except BrowseError:
        return summary
    seed = own_seed(pick, {p.id: p for p in archive.programs(run_id)})
    if seed.id == pick.id or str(pick.id) in (summary.get("pins") or {}):
        return summary
    return pin_program(archive, pick, seed, loaded, pool, config, summary, say)


def pin_program(
    archive: Archive,
    program: ProgramRecord,
    seed: ProgramRecord,
    loaded: LoadedData,
    pool: ReplayPool,
    config: FitConfig,
    summary: dict,
    say: Say = quiet,
) -> dict:
    """Pin `program`'s constants its training data cannot tell from `seed`'s and keep them in
    `summary`, the run's, which is stored (what `evolve archive pin` does to any child)."""
    from stepml_evolve.evaluator.fit.pinning import pin_to_seed

    say(f"pinning #{program.id}'s constants its training data cannot tell from seed #{seed.id}'s")
    pinning = pin_to_seed(
        parse_program(program.source), dict(program.constants), dict(seed.constants), loaded.experiments, pool, config
    )
    pins = {**(summary.get("pins") or {}), str(program.id): {"seed": seed.id, **pinning.to_json()}}
    if pinning.pinned:
        say(f"#{program.id}: {pins_text(pins[str(program.id)])}")
    summary = {**summary, "pins": pins}
    archive.set_summary(program.run_id, summary)
    return summary
