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

import time
from collections.abc import Callable

from json_stub import JsonStub


class OpenAIStub(JsonStub):
    def __init__(self, reply: Callable[[list[dict]], str] = lambda messages: "", model: str = "stub-model"):
        super().__init__(self._route)
        self.reply, self.model = reply, model
        self.status: int | None = None  # answer every request with this HTTP error instead
        self.delay_s = 0.0  # sleep this long before answering

    @property
    def url(self) -> str:
        return f"{super().url}/v1"

    @property
    def chat_requests(self) -> list[dict]:
        return [body for path, body in self.requests if path.endswith("/chat/completions")]

    def _route(self, path: str, body: dict | None) -> tuple[int, dict]:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.status is not None:
            return self.status, {"error": {"message": "scripted failure", "type": "server_error"}}
        if path.endswith("/models"):
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                                     "owned_by": "stub"}]}
        if path.endswith("/chat/completions"):
            return 200, {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": body["model"],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": self.reply(body["messages"])}}]}
        return 404, {"error": {"message": f"no route {path}"}}
