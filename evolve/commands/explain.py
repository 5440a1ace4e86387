"""`evolve explain`: where a program's error grows, and which terms would explain it.

The program (a file, or an archive's program by id or deployment rule, at its constants) is
replayed closed-loop on every experiment with its schedule kept; each measured request's error is
set against what it lived through on that schedule (evaluator/discovery/explain.py), and the typed
library of candidate terms is screened on the same residuals (discovery/screening.py), as the
`residual_term` operator screens a search's parents.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from stepml_evolve.archive.records import ExplanationRecord
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.datasets import LoadedData
from stepml_evolve.evaluator.discovery.explain import Association, explain
from stepml_evolve.evaluator.discovery.residuals import ResidualsError, residuals_of
from stepml_evolve.evaluator.discovery.screening import Screening, screen_program, tethered_to
from stepml_evolve.evaluator.dsl import Program, parse_program
from stepml_evolve.evaluator.say import SKIPPED, Say, quiet
from stepml_evolve.evaluator.scoring.pool import ReplayPool

from .evaluation_setup import EvaluationSetup


@dataclass
class Explanation:
    program: str
    data: LoadedData
    split: str
    requests: int  # measured requests the residuals cover
    associations: list[Association]
    screening: Screening

    def to_json(self, top: int = 20) -> dict:
        return {
            "program": self.program,
            "data": self.data.label,
            "split": self.split,
            "requests": self.requests,
            "associations": [
                {
                    "latency": a.latency,
                    "feature": a.feature,
                    "strength": a.strength,
                    "kind": a.kind,
                    "bins": [{"range": label, "error_pct": err, "requests": n} for label, err, n in a.bins],
                }
                for a in self.associations
            ],
            "screening": {
                "candidates": len(self.screening.results) + self.screening.skipped,
                "skipped_not_finite": self.screening.skipped,
                "passed": len(self.screening.passed),
                "false_passes_by_chance": self.screening.false_passes,
                "bounded_by_tether": self.screening.capped,
                "terms": [
                    {
                        "term": s.term.shown(),
                        "family": s.term.family,
                        "coefficient": s.coefficient,
                        "cap": s.cap if math.isfinite(s.cap) else None,
                        "gain": s.gain,
                        "chance": s.chance,
                        "held_out": s.held_out,
                        "passed": s.passed,
                    }
                    for s in self.screening.results[:top]
                ],
                "pairs": [
                    {"terms": [a.term.shown(), b.term.shown()], "gain": gain}
                    for a, b, gain in self.screening.pairs[:top]
                ],
            },
        }


def explain_program(
    program: Program,
    label: str,
    setup: EvaluationSetup = EvaluationSetup(),
    split: str = "train",
    say: Say = quiet,
    refit: bool = False,
) -> Explanation:
    """`program` at its constants on the setup's data: its error's associations and the screening of
    the term library on its residuals (with `refit`, beside its own constants refitted).
    ResidualsError (one line naming `label`) where a replay fails."""
    loaded = setup.load(say)
    with setup.replay_pool(loaded) as pool:
        return _explained(program, dict(program.constants), label, loaded, pool, split, refit)


def _explained(
    program: Program,
    constants: dict[str, float],
    label: str,
    loaded: LoadedData,
    pool: ReplayPool,
    split: str,
    refit: bool = False,
) -> Explanation:
    residuals = residuals_of(program, constants, pool, split=split, origin=label)
    tether = tethered_to(program, constants)  # as a seed's screening: tethered to the program itself
    screening = screen_program(program, constants, residuals, tether, refit)
    return Explanation(label, loaded, split, sum(r.n for r in residuals), explain(residuals), screening)


def record_explanations(
    archive: Archive, run_id: int, ids: list[int], loaded: LoadedData, pool: ReplayPool, say: Say = quiet
) -> list[ExplanationRecord]:
    """The run's programs `ids` explained on the train split and stored (those stored already are
    kept: a resumed run finishes what a killed one started), for the report. A program whose
    residuals cannot be computed is said and skipped."""
    done = {e.program_id for e in archive.explanations(run_id) if e.split == "train"}
    out = []
    for pid in dict.fromkeys(ids):
        if pid in done:
            continue
        record = archive.program(pid)
        try:
            found = _explained(parse_program(record.source), record.constants, f"#{pid}", loaded, pool, "train")
        except ResidualsError as e:
            say(f"{SKIPPED}explaining #{pid}: {e}")
            continue
        data = found.to_json()
        stored = ExplanationRecord(
            pid, "train", found.requests, data["associations"], data["screening"], created=time.time()
        )
        archive.write_explanation(stored)
        out.append(stored)
    return out


def explained_program(spec: str, archive_dir: Path | None) -> tuple[Program, str]:
    """The program `spec` names (a file, or an archive's id or deployment rule, as emit-go takes it)
    at its constants, and how a line names it."""
    from stepml_evolve.evolve.go.emission import choose_for_emission

    emission = choose_for_emission(spec, archive_dir, physics="off")  # explained as it is, whatever its physics
    if emission.choice is not None:
        return emission.program, f"#{emission.choice.program.id} (rule {emission.choice.rule})"
    return emission.program, spec if spec.endswith(".py") or "/" in spec else f"#{spec}"
