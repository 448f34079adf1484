"""A scripted OpenAI-compatible server on 127.0.0.1 for unit tests: the LLM judge's and the page summariser's.

It answers `GET /v1/models` with one model and `POST /v1/chat/completions` with the text `reply(messages)` returns,
records every request, and can fail on purpose: `status` (e.g. 500) answers every request with that error, `delay_s`
makes each answer late (a timeout on the client's side). Use it as a context manager::

    with OpenAIStub(reply=lambda messages: "Correct") as stub:
        Endpoint(EndpointConfig(base_url=stub.url, model=stub.model)).chat(...)
        assert len(stub.chat_requests) == 1

Tests import it as `from openai_stub import OpenAIStub` (pytest puts tests/ on sys.path through its conftest).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OpenAIStub:
    def __init__(self, reply: Callable[[list[dict]], str] = lambda messages: "", model: str = "stub-model"):
        self.reply, self.model = reply, model
        self.status: int | None = None  # answer every request with this HTTP error instead
        self.delay_s = 0.0  # sleep this long before answering
        self.requests: list[tuple[str, dict | None]] = []  # (path, JSON body) of every request, in order
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    @property
    def chat_requests(self) -> list[dict]:
        return [body for path, body in self.requests if path.endswith("/chat/completions")]

    def __enter__(self) -> OpenAIStub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: dict | None) -> None:
                with stub._lock:
                    stub.requests.append((self.path, body))
                if stub.delay_s:
                    time.sleep(stub.delay_s)
                if stub.status is not None:
                    self._send(stub.status, {"error": {"message": "scripted failure", "type": "server_error"}})
                elif self.path.endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": stub.model, "object": "model",
                                                                 "created": 0, "owned_by": "stub"}]})
                elif self.path.endswith("/chat/completions"):
                    text = stub.reply(body["messages"])
                    self._send(200, {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0,
                                     "model": body["model"], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                                       "total_tokens": 2},
                                     "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": text}}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    pass

            def do_GET(self):  # noqa: N802 -- http.server's name
                self._answer(None)

            def do_POST(self):  # noqa: N802
                self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

            def log_message(self, *args):
                pass

        return Handler
