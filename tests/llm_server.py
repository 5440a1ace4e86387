"""A real OpenAI-compatible HTTP server on 127.0.0.1 serving scripted chat completions.

Each request takes the next step of the script: ("reply", text), ("status", code), ("hang",
seconds) then a reply, ("garbage", body), or ("answer", fn): the reply fn(request body) returns
(for replies that depend on the prompt, e.g. a diff against the program shown). When the script
runs out, `default(n)` answers.
Every request body is kept for inspection. `TricklingLLM` is the server that answers every
request, one byte at a time (a call no per-read timeout ends).
"""

from __future__ import annotations

import json
import threading
import time

from stepml_evolve.evolve.openevolve.local_server import LocalServer, chat_completion


class _OpenAIServer(LocalServer):
    """A LocalServer seen as an OpenAI-compatible endpoint."""

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


class ScriptedLLM(_OpenAIServer):
    def __init__(self, script: list[tuple], default=None):
        self.script = list(script)
        self.default = default
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        super().__init__(self._answer)

    def _answer(self, path: str, body: dict):
        with self.lock:
            self.requests.append(body)
            n = len(self.requests)
            step = self.script.pop(0) if self.script else ("reply", self.default(n) if self.default else "no")
        kind, arg = step
        if kind == "answer":
            return 200, _completion(arg(body))
        if kind == "hang":
            time.sleep(arg)
            return 200, _completion("too late")
        if kind == "status":
            return arg, {"error": {"message": f"scripted {arg}", "type": "scripted", "code": arg}}
        if kind == "garbage":
            return 200, arg.encode()
        return 200, _completion(arg)


def _completion(text: str) -> dict:
    return chat_completion(
        text, "test-model", {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}, "chatcmpl-test"
    )


def program_reply(extra_component: str = "n_req", note: str = "adds a per-request term") -> str:
    return (
        "Here is a better program:\n```python\n"
        '"""Roofline with an extra term."""\n'
        'CONSTANTS = {"overhead_us": 2000.0, "c_compute": 2.0, "c_memory": 1.3, "k_extra": 10.0, "queue_us": 2000.0, "out_tok_us": 50.0}\n\n'
        "def step_time(f, c):\n"
        "    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc\n"
        "    memory = f.weights + f.kv_read + f.kv_write\n"
        f"    return c.overhead_us + max(c.c_compute * compute, c.c_memory * memory) + f.allreduce + c.k_extra * f.{extra_component}\n\n"
        "def queueing_time(r, c):\n    return c.queue_us\n\n"
        "def output_token_time(c):\n    return c.out_tok_us\n```\n"
        f"It {note}."
    )


INVALID_REPLY = "```python\nimport os\ndef step_time(f, c):\n    return os.getpid()\n```"
PROSE_REPLY = "I think the step time depends mostly on the batch size. You should add a term for it."


class TricklingLLM(_OpenAIServer):
    """A real OpenAI-compatible server on 127.0.0.1 that answers every request with a whole chat
    completion, but one byte every `seconds_per_byte`: no read ever waits long, the reply takes
    minutes. `abandoned` counts the replies whose client closed the connection before the end."""

    def __init__(self, seconds_per_byte: float = 0.2):
        from http.server import BaseHTTPRequestHandler

        owner = self
        self.abandoned = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.dumps(_completion(program_reply())).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(seconds_per_byte)
                except (BrokenPipeError, ConnectionResetError):
                    with owner.lock:
                        owner.abandoned += 1

        self.lock = threading.Lock()
        super().__init__(handler=Handler)
