"""`--unexercised reject`: a child may not use a component the data never varies more often than
its first parent (a term in it fits the data equally well at any constant)."""

from __future__ import annotations

import json
import shutil

from conftest import archive_rows, tiny_run

from stepml_evolve.evaluator.dsl import parse_program
from stepml_evolve.evaluator.hardware.components import unexercised_components
from stepml_evolve.evaluator.replay.closed_loop import experiment_coefficients

ONE_DEPLOYMENT = "synth-llama-2-7b-tp1-general"  # the built-in sample's one experiment at TP 1


def _unexercised(experiments) -> list[str]:
    return unexercised_components([experiment_coefficients(e) for e in experiments])


def test_the_components_a_dense_tp1_deployment_never_varies_and_none_of_a_mixed_sample(synthetic):
    assert _unexercised(synthetic.experiments) == []  # four models at TP 1, 2 and 4, one of them MoE
    one = [e for e in synthetic.experiments if e.name == ONE_DEPLOYMENT]
    # no all-reduce at TP 1, no experts in a dense model, one layer count, one TP
    assert _unexercised(one) == ["allreduce", "experts", "layers", "tp"]
    at_tp2 = [e for e in synthetic.experiments if e.tp == 2]  # a dense and an MoE model
    assert _unexercised(at_tp2) == ["tp"]


def _one_deployment(synthetic, tmp_path):
    src = next(p for p in synthetic.directory.iterdir() if p.name == ONE_DEPLOYMENT)
    data = tmp_path / "data"
    shutil.copytree(src, data / src.name)
    return data


def _more_uses(archive) -> list[str]:
    """The archived children that use an unexercised component more often than their first parent."""
    rows = archive_rows(
        archive,
        "SELECT c.source, p.source FROM programs c "
        "JOIN programs p ON p.id = json_extract(c.parents, '$[0]') WHERE c.operator != 'seed'",
    )
    out = []
    for child, parent in rows:
        after, before = parse_program(child).component_uses, parse_program(parent).component_uses
        out += [c for c in ("allreduce", "experts", "layers", "tp") if after[c] > before[c]]
    return out


def test_reject_keeps_terms_the_data_cannot_judge_out_of_the_archive(synthetic, tmp_path):
    data, archive = _one_deployment(synthetic, tmp_path), tmp_path / "run"
    res = tiny_run(archive, 10, "--data", str(data))  # reject is the default
    assert res.exit_code == 0, res.output
    assert archive_rows(archive, "SELECT COUNT(*) FROM programs WHERE operator != 'seed'")[0][0] > 0
    assert not _more_uses(archive)
    # what the rule kept out: with --unexercised allow this search archives such children (e.g.
    # add_term's `+ k * f.layers`), which fit one deployment exactly as well at any k
    rejected = archive_rows(archive, "SELECT parents, reason FROM rejections WHERE rule = 'unexercised'")
    assert rejected
    for parents, reason in rejected:
        first = json.loads(parents)[0]
        assert reason.startswith("uses f.") and f"(its parent #{first}: " in reason, reason
        assert reason.endswith("which never varies in the data: no fit can judge the change"), reason

    res = tiny_run(archive, 11, "--data", str(data), "--resume", "--unexercised", "allow")
    assert res.exit_code == 2 and "unexercised: run reject, now allow" in res.stderr
