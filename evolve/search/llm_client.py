"""LLM calls through litellm (any provider), with an on-disk reply cache and bounded retries.

The cache is keyed by the full request (model, messages, sampling parameters; not the server
URL) and holds the request's whole history: every attempt (failed ones too) and the reply, or
the final failure. It is written as soon as the request ends, so a finished or killed run
replays offline and deterministically: the same archive state gives the same prompts, which hit
the cache and yield the same attempts, the same budget spent and the same outcome. A failure the
server never answered (the deadline passed, no connection, an error raised here before or
without a reply) is what the settings or the network caused, not the LLM's answer: it is kept for
that offline replay, but a client that may call out asks again rather than serve it.
Transient failures (timeouts, 429 rate limits, 5xx, connection errors) are retried a bounded
number of times with backoff; every attempt is reported to the caller for the archive.
The timeout is a deadline on the whole call, not on each read of the socket (a server that
sends a byte a second never idles long enough for a read timeout): a call still running at the
deadline is cancelled, its connection closed, and the attempt counts as a timeout (which the
circuit breaker counts as it counts a hang).
A reply is kept up to MAX_REPLY_CHARS (the rest is cut off, with a marker saying so), so what is
cached, archived and fed back into a retry prompt is bounded whatever a server sends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepml_evolve.evaluator.dsl.program import MAX_SOURCE_BYTES
from stepml_evolve.evaluator.outputs import write_atomic
from stepml_evolve.evolve.search.settings import DEFAULT_TIMEOUT_S

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of the price table at import
os.environ.setdefault("LITELLM_TELEMETRY", "False")

# the outcomes of an attempt that got no answer from the server (the deadline passed, no
# connection): what the settings or the network caused, never the LLM's answer to the request
NOT_ANSWERED = ("timeout", "connection_error")
# The longest reply kept: as many characters as the longest program the DSL takes has bytes, so a
# reply with a program of any admissible size fits, and a runaway reply costs at most this much.
MAX_REPLY_CHARS = MAX_SOURCE_BYTES


def cap_reply(content: str) -> tuple[str, int | None]:
    """The reply as it is kept (at most MAX_REPLY_CHARS, a marker included: capping it again
    changes nothing), and its length as received when it was cut (None when it was not)."""
    if len(content) <= MAX_REPLY_CHARS:
        return content, None
    marker = f"\n[... cut: the reply had {len(content)} characters; only its beginning is kept]"
    return content[: MAX_REPLY_CHARS - len(marker)] + marker, len(content)


@dataclass
class Attempt:
    """One call as the archive records it."""

    model: str
    request_hash: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    outcome: str = "ok"  # ok, timeout, rate_limited, server_error, connection_error, error, not_cached
    error: str | None = None
    cached: bool = False

    def record(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Reply:
    content: str
    attempts: list[Attempt] = field(default_factory=list)
    received_chars: int | None = None  # the reply's length as the server sent it, when it was cut (cap_reply)


class LLMUnavailable(Exception):
    """Every attempt failed; `attempts` says how."""

    def __init__(self, message: str, attempts: list[Attempt]):
        super().__init__(message)
        self.attempts = attempts


class CallDeadline(Exception):
    """A call still running at its deadline (the whole call's timeout), cancelled."""


class _CallLoop:
    """One event loop on a daemon thread, shared by every client of the process, that runs the
    calls: a call is a task that can be cancelled at its deadline (a blocking call in a thread
    could only be abandoned, still reading). One loop for the process's lifetime, so the HTTP
    clients litellm keeps per loop stay usable from call to call."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _pid = 0  # the process whose thread runs _loop (a forked child starts its own)

    @classmethod
    def run(cls, make_call: Callable[[], Awaitable[Any]], deadline_s: float) -> Any:
        """The result of the coroutine `make_call()` makes, or CallDeadline after deadline_s seconds."""
        future = asyncio.run_coroutine_threadsafe(cls._call(make_call), cls._get())
        try:
            return future.result(timeout=deadline_s)
        except concurrent.futures.TimeoutError:
            future.cancel()  # cancels the task: its connection is closed, its reads end
            raise CallDeadline(f"no complete reply within {deadline_s:g} s (the whole call's deadline)") from None
        except BaseException:  # e.g. Ctrl-C while waiting: the call ends too
            future.cancel()
            raise

    @staticmethod
    async def _call(make_call):
        return await make_call()

    @classmethod
    def _get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="llm-calls", daemon=True).start()
                cls._loop, cls._pid = loop, os.getpid()
            return cls._loop


def request_hash(model: str, messages: list[dict], temperature: float, max_tokens: int, tag: str = "") -> str:
    request = {"model": model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
    if tag:  # not sent: it tells apart requests whose messages are the same (an unset tag keeps old keys)
        request["tag"] = tag
    payload = json.dumps(request, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


class LLMClient:
    def __init__(
        self,
        model: str,
        cache_dir: str | Path,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = 3,
        backoff_s: float = 2.0,
        temperature: float = 0.8,
        max_tokens: int = 2048,
        offline: bool = False,
    ):
        self.model, self.base_url, self.api_key = model, base_url, api_key
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.temperature, self.max_tokens, self.offline = temperature, max_tokens, offline
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.json"

    def _cached(self, key: str) -> dict | None:
        p = self._cache_path(key)
        if not p.is_file():
            return None
        try:
            entry = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # a torn cache file is treated as a miss
        return entry if isinstance(entry, dict) else None

    def _store(self, key: str, entry: dict) -> None:
        p = self._cache_path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, json.dumps(entry), fsync=True)

    def _replay(self, key: str, hit: dict) -> Reply:
        """A cached request: its recorded attempts (marked cached) and its reply or failure."""
        if "attempts" in hit:
            attempts = [Attempt(**{**a, "cached": True}) for a in hit["attempts"]]
        else:  # an entry from before failures were cached: the reply alone
            attempts = [
                Attempt(
                    self.model,
                    key,
                    hit["prompt_tokens"],
                    hit["completion_tokens"],
                    hit["cost_usd"],
                    hit["latency_s"],
                    cached=True,
                )
            ]
        if hit.get("content") is None:
            raise LLMUnavailable(hit.get("error") or "failed (cached)", attempts)
        content, cut_from = cap_reply(hit["content"])  # an entry cached before replies were capped
        return Reply(content, attempts, hit.get("received_chars") or cut_from)

    def _store_history(
        self,
        key: str,
        attempts: list[Attempt],
        content: str | None,
        error: str | None = None,
        received_chars: int | None = None,
        answered: bool = True,
    ) -> None:
        entry = {
            "content": content,
            "error": error,
            "answered": answered,  # False: no answer of the server (see _answered)
            "model": self.model,
            "created": time.time(),
            "attempts": [{**a.record(), "cached": False} for a in attempts],
        }
        if received_chars is not None:
            entry["received_chars"] = received_chars
        self._store(key, entry)

    def complete(
        self, messages: list[dict], may_retry: Callable[[list[Attempt]], bool] | None = None, tag: str = ""
    ) -> Reply:
        """The reply to `messages`; raises LLMUnavailable when every attempt failed. may_retry
        (given the attempts so far) can stop retries early, e.g. when a budget is spent. tag joins
        the cache key only: the n-th asking of the same messages gets its own reply."""
        key = request_hash(self.model, messages, self.temperature, self.max_tokens, tag)
        hit = self._cached(key)
        if hit is not None and (self.offline or _answered(hit)):
            return self._replay(key, hit)
        if self.offline:
            a = Attempt(self.model, key, outcome="not_cached", error="offline and the reply is not in the cache")
            raise LLMUnavailable("reply not cached (offline)", [a])
        import litellm

        attempts: list[Attempt] = []
        for attempt in range(self.max_retries + 1):
            t0 = time.perf_counter()
            a = Attempt(self.model, key)
            try:
                resp = _CallLoop.run(
                    lambda: litellm.acompletion(
                        model=self.model,
                        messages=messages,
                        temperature=self.temperature,
                        max_tokens=self.max_tokens,
                        timeout=self.timeout_s,
                        num_retries=0,
                        base_url=self.base_url,
                        api_key=self.api_key or ("none" if self.base_url else None),
                    ),
                    self.timeout_s,
                )
                a.latency_s = time.perf_counter() - t0
                usage = getattr(resp, "usage", None)
                a.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
                a.completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
                try:  # priced by the model asked for (a server may report another name)
                    a.cost_usd = float(litellm.completion_cost(completion_response=resp, model=self.model) or 0.0)
                except Exception:  # a model litellm has no price for (e.g. a local server): free
                    a.cost_usd = 0.0
                content, received_chars = cap_reply(resp.choices[0].message.content or "")
                attempts.append(a)
                self._store_history(key, attempts, content, received_chars=received_chars)
                return Reply(content, attempts, received_chars)
            except Exception as e:  # classify, record, maybe retry
                a.latency_s = time.perf_counter() - t0
                a.outcome, retry = _classify(e)
                a.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                attempts.append(a)
                if not retry or attempt == self.max_retries or (may_retry is not None and not may_retry(attempts)):
                    answered = a.outcome not in NOT_ANSWERED and isinstance(getattr(e, "status_code", None), int)
                    self._store_history(key, attempts, None, a.error, answered=answered)
                    raise LLMUnavailable(a.error, attempts) from None
                time.sleep(self.backoff_s * (2**attempt) if a.outcome == "rate_limited" else self.backoff_s)
        raise LLMUnavailable("retries exhausted", attempts)  # pragma: no cover - loop always returns or raises


def _answered(entry: dict) -> bool:
    """Whether a cache entry holds the server's answer to its request: a reply, or a failure the
    server sent (an HTTP error status); not a deadline, a lost connection or an error raised here
    (an entry from before this was recorded: by its last attempt's outcome)."""
    if entry.get("content") is not None:
        return True
    if "answered" in entry:
        return bool(entry["answered"])
    attempts = entry.get("attempts")
    last = attempts[-1] if isinstance(attempts, list) and attempts and isinstance(attempts[-1], dict) else {}
    return last.get("outcome") not in NOT_ANSWERED


def _classify(e: Exception) -> tuple[str, bool]:
    import litellm

    if isinstance(e, (CallDeadline, litellm.Timeout)):
        return "timeout", True
    if isinstance(e, litellm.RateLimitError):
        return "rate_limited", True
    if isinstance(e, (litellm.InternalServerError, litellm.ServiceUnavailableError)):
        return "server_error", True
    if isinstance(e, litellm.APIConnectionError):
        return "connection_error", True
    status = getattr(e, "status_code", None)
    if isinstance(status, int) and status >= 500:
        return "server_error", True
    return "error", False
