"""Which CV scores rank programs against each other: a run's scores by program (`cv_by_program`),
the protocol preferred (`preferred_protocol`: the one most programs have scores of; ties: lomo,
lowo, any other by name) and, of it, the scores fitted with one setting (`comparable`,
`ranked_cv`). The deployment rules (rules.py), `evolve archive list --sort cv` and the report rank
by the same."""

from __future__ import annotations

import json
from collections import Counter

from stepml_evolve.archive.access import protocol_order
from stepml_evolve.archive.records import CVScoreRecord
from stepml_evolve.archive.store import Archive
from stepml_evolve.evaluator.numbers import finite

CVScores = dict[int, dict[str, CVScoreRecord]]  # program id -> protocol -> score


def cv_by_program(archive: Archive, run_id: int) -> CVScores:
    out: CVScores = {}
    for s in archive.cv_scores(run_id=run_id):
        out.setdefault(s.program_id, {})[s.protocol] = s
    return out


def preferred_protocol(cv: CVScores, program_ids: set[int] | None = None) -> str | None:
    """The protocol whose CV loss ranks programs: the one most programs (of `program_ids`, if given)
    have a finite score of, ties in the order of CV_PREFERENCE (lomo, lowo, then any other by name);
    None if none has. By count, so that a second question asked of a few programs (--guard-cv, an
    `evolve archive cv` of one program) does not rank them alone."""
    counts = Counter(
        proto
        for pid, scores in cv.items()
        if program_ids is None or pid in program_ids
        for proto, s in scores.items()
        if finite(s.loss)
    )
    # max keeps the first of equals: the order of preference breaks ties
    return max(protocol_order(counts), key=counts.__getitem__, default=None)


def comparable(scores: dict[int, CVScoreRecord]) -> tuple[dict[int, CVScoreRecord], str, int]:
    """The scores of one protocol that may be ranked against each other, the settings they share (in
    words) and how many scores are left out. A fold fit's budget and method shift every program's CV
    loss one way (on the real data, regime_switch's LOMO at fold seed 0: 742 with the default
    budget, 444 with 8 evaluations a fold), so only scores of one setting are ranked: the setting
    most programs were scored with (the run's own CV scores its front and their seeds alike; ties:
    the newest score's). The fold fits' seed is not part of a setting: it is a draw, different for
    every program whatever its number (regime_switch at 8 evaluations: 444, 2,822, 367 at seeds 0,
    7, 1; the --cv lomo run's #960: 48.9, 44.3, 47.6), and a search under --cv gives every promoted
    child a seed of its own."""
    groups: dict[str, dict[int, CVScoreRecord]] = {}
    for pid, s in scores.items():
        groups.setdefault(json.dumps(_procedure(s), sort_keys=True), {})[pid] = s
    if not groups:
        return {}, "", 0
    kept = max(groups.values(), key=lambda g: (len(g), max(s.created for s in g.values())))
    return kept, _settings_words(list(kept.values())), len(scores) - len(kept)


def _procedure(s: CVScoreRecord) -> dict:
    return {k: v for k, v in s.settings().items() if k != "seed"}


def _settings_words(scores: list[CVScoreRecord]) -> str:
    s = scores[0]
    seeds = {x.seed for x in scores}
    seed = f"fit seed {s.seed}" if len(seeds) == 1 else "a fit seed per program"
    budget = f"max-evals {s.max_evals}" if s.max_evals else "the default budget"
    return f"{seed}, {budget}, {s.method or 'the default method'}, {s.objective}"


def ranked_cv(
    cv: CVScores, program_ids: set[int], protocol: str | None = None
) -> tuple[str | None, dict[int, CVScoreRecord], str, int]:
    """What ranks programs by CV loss: `protocol` (default: the preferred one), the finite scores of
    it that share one setting (`comparable`), that setting in words and how many finite scores it
    leaves out (a protocol no program has a finite score of ranks nothing: None)."""
    protocol = protocol or preferred_protocol(cv, program_ids)
    if protocol is None:
        return None, {}, "", 0
    scores = {pid: s for pid in program_ids if (s := cv.get(pid, {}).get(protocol)) and finite(s.loss)}
    if not scores:
        return None, {}, "", 0
    return protocol, *comparable(scores)
