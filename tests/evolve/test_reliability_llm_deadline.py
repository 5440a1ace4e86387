"""A whole-call deadline on every LLM request (issue 55): `--llm-timeout` bounds the call, not
each read of its socket, so a real local server that trickles a reply one byte at a time is cut
at the deadline, the attempt counts as a timeout, its connection is closed, and the circuit
breaker opens as it does for a server that hangs. The OpenEvolve engine's LLM calls go through
the same client (evolve/openevolve/engine.py answers them with it)."""

from __future__ import annotations

import time

from conftest import RooflineParent
from llm_server import TricklingLLM

from stepml_evolve.evolve.search.llm_client import LLMClient, LLMUnavailable
from stepml_evolve.evolve.search.llm_operator import BREAKER_LIMIT, Budget, LLMOperator

ROWS = [{"experiment": "exp-a", "split": "train", "e2e_obs": 2.0, "e2e_err": 12.0, "ttft_obs": 0.03, "ttft_err": -40.0}]
TIMEOUT_S = 1.0
SLACK_S = 1.5  # a loaded machine's scheduling; the trickled reply itself takes about a minute


def _client(server, tmp_path, retries: int) -> LLMClient:
    return LLMClient(
        "openai/test-model",
        tmp_path / "cache",
        base_url=server.base_url,
        timeout_s=TIMEOUT_S,
        max_retries=retries,
        backoff_s=0.01,
    )


def _wait_for(condition, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.05)
    return condition()


def test_a_trickled_reply_is_cut_at_the_deadline_and_counted_as_a_timeout(tmp_path):
    with TricklingLLM(seconds_per_byte=0.2) as server:
        client = _client(server, tmp_path, retries=0)
        try:
            client.complete([{"role": "user", "content": "hello"}])
            raise AssertionError("a reply trickled over a minute came back as a success")
        except LLMUnavailable as e:
            attempts = e.attempts
        assert [a.outcome for a in attempts] == ["timeout"]
        assert TIMEOUT_S * 0.9 <= attempts[0].latency_s < TIMEOUT_S + SLACK_S
        assert "deadline" in attempts[0].error
        # the call was cancelled: its connection closed (the server sees it at its next byte; a loaded
        # machine can take seconds to run the cancelled task's cleanup)
        assert _wait_for(lambda: server.abandoned == 1, seconds=30.0)


def test_a_trickling_server_opens_the_breaker_as_a_hanging_one_does(tmp_path):
    with TricklingLLM(seconds_per_byte=0.2) as server:
        op = LLMOperator(_client(server, tmp_path, retries=BREAKER_LIMIT), Budget())
        p = op.propose(RooflineParent, ROWS, [])
        assert [a.outcome for a in p.attempts] == ["timeout"] * BREAKER_LIMIT
        assert p.source is None and p.rule == "llm-breaker" and op.breaker.is_open()
        assert all(a.latency_s < TIMEOUT_S + SLACK_S for a in p.attempts)
        assert _wait_for(lambda: server.abandoned == BREAKER_LIMIT)
