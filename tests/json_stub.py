"""A JSON-over-HTTP server on 127.0.0.1 for unit tests (a SandboxFusion server, a Search-R1 retrieval server, and
through `openai_stub.OpenAIStub` an OpenAI-compatible one): every request goes to `answer(path, payload)` (the JSON
body of a POST, None for a GET), which returns `(status, body)`; a None body with a status other than 200 is sent as
that HTTP error. Every request is kept in `requests` as `(path, payload)`. Use it as a context manager::

    with JsonStub(lambda path, payload: (200, {"ok": True})) as stub:
        urllib.request.urlopen(stub.url + "/run_code", data=b"{}")

Tests import it as `from json_stub import JsonStub` (pytest puts tests/ on sys.path through its conftest).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonStub:
    def __init__(self, answer: Callable[[str, dict], tuple[int, dict | None]]):
        self.answer = answer
        self.requests: list[tuple[str, dict | None]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    @property
    def payloads(self) -> list[dict]:
        return [payload for _, payload in self.requests]

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, payload: dict | None) -> None:
                with stub._lock:
                    stub.requests.append((self.path, payload))
                status, answer = stub.answer(self.path, payload)
                if answer is None:
                    self.send_error(status)
                    return
                body = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    pass

            def do_GET(self):  # noqa: N802 -- http.server's name
                self._answer(None)

            def do_POST(self):  # noqa: N802
                self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

            def log_message(self, *args):
                pass

        return Handler

    def __enter__(self) -> JsonStub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
