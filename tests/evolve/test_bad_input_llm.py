"""Bad input on the LLM side (issue 27), against a real local OpenAI-compatible server: a huge
reply is cut to the cap before it is cached, archived or fed back into the retry prompt, and a
server that hangs opens the circuit breaker, which ends LLM proposals for the rest of the
generation (recorded in the archive; symbolic children go on; the next generation asks again)."""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter

from conftest import ONE_SEED_SCREENED, RooflineParent
from llm_server import ScriptedLLM, program_reply
from typer.testing import CliRunner

from stepml_evolve.archive.store import Archive
from stepml_evolve.evolve.cli.app import app
from stepml_evolve.evolve.search.llm_client import MAX_REPLY_CHARS, LLMClient
from stepml_evolve.evolve.search.llm_operator import BREAKER_LIMIT, Budget, LLMOperator

HUGE = 300_000  # characters: the 10 MB reply, smaller to stay fast; still far over the cap


def huge_reply() -> str:
    return "```python\n" + "x = 1\n" * (HUGE // 6) + "```\n"


def test_a_huge_reply_is_cut_before_it_is_cached_or_fed_back(tmp_path):
    cache = tmp_path / "cache"
    with ScriptedLLM([("reply", huge_reply()), ("reply", program_reply())]) as server:
        client = LLMClient("openai/test-model", cache, base_url=server.base_url, timeout_s=5.0, backoff_s=0.01)
        p = LLMOperator(client, Budget()).propose(RooflineParent, [], [])
        assert [a.outcome for a in p.attempts] == ["too_large", "valid"] and p.source is not None
        assert f"more than the {MAX_REPLY_CHARS} a reply may have" in p.attempts[0].error
        first, retry = (sum(len(m["content"]) for m in r["messages"]) for r in server.requests)
        fed_back = server.requests[1]["messages"][-2]
        assert fed_back["role"] == "assistant" and len(fed_back["content"]) <= MAX_REPLY_CHARS
        assert "[... cut: the reply had" in fed_back["content"]
        assert retry < first + MAX_REPLY_CHARS + 1_000  # the retry prompt: not the whole reply again
    cached = sum(f.stat().st_size for f in cache.rglob("*.json"))
    assert cached < 3 * MAX_REPLY_CHARS  # the cut reply once (in the first request's entry), not 1 MB
    # replayed offline from the cache: the same outcomes, the same cut reply fed back
    offline = LLMOperator(LLMClient("openai/test-model", cache, offline=True), Budget()).propose(RooflineParent, [], [])
    assert [a.outcome for a in offline.attempts] == ["too_large", "valid"] and offline.source == p.source


RUN = [
    "run",
    "--generations",
    "2",
    "--seed",
    "5",
    "--children",
    "3",
    *ONE_SEED_SCREENED,
    "--llm",
    "openai/test-model",
    "--llm-ratio",
    "1.0",
    "--llm-timeout",
    "3",
]


def _variety(n: int) -> str:
    return program_reply(("n_req", "kv_read", "kv_write", "attn_dc", "attn_pf")[n % 5], note=f"variant {n}")


def _calls_and_rejections(d, up_to: int = 2):
    db = sqlite3.connect(d / Archive.FILE)
    where = (up_to,)
    calls = db.execute(
        "SELECT generation, outcome, request_hash FROM llm_calls WHERE generation <= ? ORDER BY id", where
    ).fetchall()
    rejections = db.execute(
        "SELECT generation, operator, rule, reason FROM rejections WHERE generation <= ? ORDER BY id", where
    ).fetchall()
    operators = db.execute("SELECT generation, operator FROM programs WHERE generation <= ? ORDER BY id", where)
    operators = operators.fetchall()
    db.close()
    return calls, rejections, operators


def test_a_hanging_server_opens_the_breaker_for_the_rest_of_the_generation(tmp_path):
    """The server hangs for the first requests: generation 1 makes BREAKER_LIMIT timed-out
    attempts (not 4 children x 4 attempts), its other children are symbolic, the archive records
    `llm-breaker`; generation 2 asks the LLM again (now answering) from a closed breaker. Replayed
    offline, the breaker opens at the same attempt."""
    first = tmp_path / "first"
    with ScriptedLLM([("hang", 12.0)] * BREAKER_LIMIT, default=_variety) as server:
        res = CliRunner().invoke(app, [*RUN, "--archive", str(first), "--llm-base-url", server.base_url])
        assert res.exit_code == 0, res.output
        n_http = len(server.requests)
    calls, rejections, operators = _calls_and_rejections(first)
    gen1 = [outcome for g, outcome, _ in calls if g == 1]
    assert gen1 == ["timeout"] * BREAKER_LIMIT
    assert [r[2] for r in rejections if r[0] == 1 and r[2].startswith("llm-")] == ["llm-breaker"]
    llm = "llm:openai/test-model"
    by_generation = Counter((g, op == llm) for g, op in operators)
    assert by_generation[(1, False)] >= 1 and by_generation[(1, True)] == 0  # symbolic children went on
    assert by_generation[(2, True)] >= 1  # the next generation asked the LLM again
    assert n_http == len(calls) == BREAKER_LIMIT + sum(g == 2 for g, _, _ in calls)
    notices = [ln for ln in res.stderr.splitlines() if "the LLM is not asked again" in ln]
    assert len(notices) == 1 and notices[0].startswith("generation 1: ") and "timed out" in notices[0]

    # replayed offline from the cache (up to the generation that matters): the same archive
    second = tmp_path / "second"
    shutil.copytree(first / "llm_cache", second / "llm_cache")
    replay = [*RUN, "--archive", str(second), "--llm-offline"]
    replay[replay.index("--generations") + 1] = "1"
    res = CliRunner().invoke(app, replay)
    assert res.exit_code == 0, res.output
    assert _calls_and_rejections(second, up_to=1) == _calls_and_rejections(first, up_to=1)
