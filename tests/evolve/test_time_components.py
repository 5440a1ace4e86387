"""`--time-components keep`: a child may not drop a time component its first parent uses."""

from __future__ import annotations

import json

from conftest import archive_rows, tiny_run

from stepml_evolve.evaluator.hardware.components import COMPONENTS, TIME_COMPONENTS


def _children(archive) -> list[tuple[set[str], set[str]]]:
    """(time components of the child, of its first parent) for every archived child."""
    rows = archive_rows(
        archive,
        "SELECT c.components, p.components FROM programs c "
        "JOIN programs p ON p.id = json_extract(c.parents, '$[0]') WHERE c.operator != 'seed'",
    )
    return [(set(json.loads(c)) & TIME_COMPONENTS, set(json.loads(p)) & TIME_COMPONENTS) for c, p in rows]


def _rejections(archive, rule: str) -> list[tuple[str, str]]:
    return archive_rows(archive, "SELECT parents, reason FROM rejections WHERE rule = ?", rule)


def test_the_time_components_are_the_components_measured_in_microseconds():
    assert TIME_COMPONENTS == {
        "gemm_pf",
        "gemm_dc",
        "attn_pf",
        "attn_dc",
        "weights",
        "kv_read",
        "kv_write",
        "allreduce",
    }
    assert all(unit == "count" for name, unit, _ in COMPONENTS if name not in TIME_COMPONENTS)


def test_keep_rejects_every_child_that_drops_a_time_component_and_free_admits_them(tmp_path):
    free, keep = tmp_path / "free", tmp_path / "keep"
    assert tiny_run(free, 3, "--time-components", "free").exit_code == 0
    assert any(parent - child for child, parent in _children(free)), "no child dropped a time component"
    assert not _rejections(free, "time-components")

    res = tiny_run(keep, 3)  # keep is the default
    assert res.exit_code == 0, res.output
    children = _children(keep)
    assert children and all(parent <= child for child, parent in children)
    rejected = _rejections(keep, "time-components")
    assert rejected, "the same search proposed no child that drops one"
    for parents, reason in rejected:
        first = json.loads(parents)[0]
        assert reason.startswith("drops f.") and reason.endswith(f"which its parent #{first} uses"), reason

    res = tiny_run(keep, 4, "--resume", "--time-components", "free")
    assert res.exit_code == 2 and "time-components: run keep, now free" in res.stderr
