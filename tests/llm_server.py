"""A real OpenAI-compatible HTTP server on 127.0.0.1 serving scripted chat completions.

Each request takes the next step of the script: ("reply", text), ("status", code), ("hang",
seconds) then a reply, or ("garbage", body). When the script runs out, `default(n)` answers.
Every request body is kept for inspection.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedLLM:
    def __init__(self, script: list[tuple], default=None):
        self.script = list(script)
        self.default = default
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server.lock:
                    server.requests.append(body)
                    n = len(server.requests)
                    step = server.script.pop(0) if server.script else ("reply", server.default(n) if server.default else "no")
                kind, arg = step
                if kind == "hang":
                    time.sleep(arg)
                    return self._send(200, _completion("too late"))
                if kind == "status":
                    return self._send(arg, {"error": {"message": f"scripted {arg}", "type": "scripted", "code": arg}})
                if kind == "garbage":
                    data = arg.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return None
                return self._send(200, _completion(arg))

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _completion(text: str) -> dict:
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 1, "model": "test-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}}


def program_reply(extra_component: str = "n_req", note: str = "adds a per-request term") -> str:
    return ("Here is a better program:\n```python\n"
            '"""Roofline with an extra term."""\n'
            'CONSTANTS = {"overhead_us": 2000.0, "c_compute": 2.0, "c_memory": 1.3, "k_extra": 10.0, "queue_us": 2000.0, "out_tok_us": 50.0}\n\n'
            "def step_time(f, c):\n"
            "    compute = f.gemm_pf + f.gemm_dc + f.attn_pf + f.attn_dc\n"
            "    memory = f.weights + f.kv_read + f.kv_write\n"
            f"    return c.overhead_us + max(c.c_compute * compute, c.c_memory * memory) + c.k_extra * f.{extra_component}\n\n"
            "def queueing_time(r, c):\n    return c.queue_us\n\n"
            "def output_token_time(c):\n    return c.out_tok_us\n```\n"
            f"It {note}.")


INVALID_REPLY = "```python\nimport os\ndef step_time(f, c):\n    return os.getpid()\n```"
PROSE_REPLY = "I think the step time depends mostly on the batch size. You should add a term for it."
