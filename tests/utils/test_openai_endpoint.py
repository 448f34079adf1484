"""verl/utils/openai_endpoint.py against a scripted server on 127.0.0.1 (tests/openai_stub.py): model discovery,
retries of failed and late requests, errors that name the URL and the fix within a bounded time, bounded
concurrency, and the config section's rules."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from openai_stub import OpenAIStub

from verl.utils.openai_endpoint import Endpoint, EndpointConfig, EndpointError, map_concurrently

MESSAGES = [{"role": "user", "content": "Is 2 + 2 = 4?"}]


def endpoint(url: str, **config) -> Endpoint:
    return Endpoint(EndpointConfig(base_url=url, **config))


def test_from_dict_names_the_section_and_the_key():
    with pytest.raises(ValueError, match=r"judge\.base_url is not set.*judge\.base_url=http://127\.0\.0\.1:8000/v1"):
        EndpointConfig.from_dict({"model": "m"}, "judge")
    with pytest.raises(ValueError, match=r"judge: unknown key\(s\) \['url'\]; an endpoint takes base_url, model"):
        EndpointConfig.from_dict({"url": "http://x"}, "judge")
    with pytest.raises(
        ValueError,
        match=r"x\.timeout_s=0 must be > 0; x\.max_retries=-1 must be >= 0; "
        r"x\.concurrency=0 must be >= 1",
    ):
        EndpointConfig.from_dict({"base_url": "http://x", "timeout_s": 0, "max_retries": -1, "concurrency": 0}, "x")
    config = EndpointConfig.from_dict({"base_url": "http://127.0.0.1:9/", "concurrency": 2}, "x")
    assert (config.concurrency, config.max_retries) == (2, 3)
    assert Endpoint(config).url == "http://127.0.0.1:9/v1"


def test_the_only_served_model_is_discovered():
    with OpenAIStub(reply=lambda messages: "Correct", model="judge-7b") as stub:
        client = endpoint(stub.url)
        assert client.chat(MESSAGES) == "Correct"
        assert client.model == "judge-7b"
        assert [path for path, _ in stub.requests] == ["/v1/models", "/v1/chat/completions"]
        assert stub.chat_requests[0]["model"] == "judge-7b"


def test_http_500_is_retried_then_a_clear_error():
    with OpenAIStub() as stub:
        stub.status = 500
        start = time.monotonic()
        with pytest.raises(EndpointError, match=r"/v1: a chat completion failed with HTTP 500 after 2 retries"):
            endpoint(stub.url, model="m", max_retries=2).chat(MESSAGES)
        assert len(stub.chat_requests) == 3  # the first try and two retries
        assert time.monotonic() - start < 15


def test_a_late_answer_is_retried_and_the_retry_answers():
    calls = []

    def reply(messages):
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(1.5)  # past the client's timeout: it gives up and asks again
        return "Incorrect"

    with OpenAIStub(reply=reply) as stub:
        assert endpoint(stub.url, model="m", timeout_s=0.5, max_retries=1).chat(MESSAGES) == "Incorrect"
        assert len(stub.chat_requests) == 2


def test_timeouts_after_the_retries_are_a_clear_error_not_a_hang():
    with OpenAIStub() as stub:
        stub.delay_s = 2.0
        start = time.monotonic()
        with pytest.raises(
            EndpointError,
            match=r"timed out \(0.3 s per request, 1 retries\); raise the endpoint's "
            r"timeout_s",
        ):
            endpoint(stub.url, model="m", timeout_s=0.3, max_retries=1).chat(MESSAGES)
        assert time.monotonic() - start < 10


def test_an_unreachable_server_is_a_clear_error():
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(EndpointError, match=r"could not connect after 0 retries .*is the server running"):
        _ = endpoint(url, max_retries=0).model


def test_map_concurrently_keeps_order_and_bounds_the_calls_in_flight():
    lock, in_flight, peak = threading.Lock(), [0], [0]

    def work(x):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.02 * (x % 3))
        with lock:
            in_flight[0] -= 1
        return x * x

    assert map_concurrently(work, range(12), concurrency=3) == [x * x for x in range(12)]
    assert peak[0] == 3
    with pytest.raises(ZeroDivisionError):
        map_concurrently(lambda x: 1 / x, [1, 0, 2], concurrency=2)
