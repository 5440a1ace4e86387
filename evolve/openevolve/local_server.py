"""A JSON-over-HTTP server on 127.0.0.1 (a free port), answering POSTs from one function.

Used by `--engine openevolve`'s judge (evolve/openevolve/engine.py), the tests' scripted LLM and
tools/compare_engines.py. `route(path, body)` returns (status, payload): a payload of bytes is
sent as it is (a test can answer garbage), anything else as JSON.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Route = Callable[[str, dict], tuple[int, Any]]


class LocalServer:
    def __init__(self, route: Route | None = None, handler: type[BaseHTTPRequestHandler] | None = None):
        """Answers POSTs with `route`, or serves with a request handler of its own (`handler`: a
        test's server that streams its reply)."""
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler or _json_handler(route))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _json_handler(route: Route) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            code, payload = route(self.path, body)
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                pass

    return Handler


def chat_completion(text: str, model: str, usage: dict, reply_id: str = "chatcmpl-local") -> dict:
    """An OpenAI chat completion holding `text`."""
    return {
        "id": reply_id,
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "usage": usage,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
    }
