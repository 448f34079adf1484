"""One way to reach an OpenAI-compatible model server (`vllm serve`, SGLang, a hosted API) from Quiver.

The agent-evaluation engine (`rollout.name=openai`), the LLM judge of `main_eval` and the search tool's page summariser
all talk to such servers. They share this module so that every call has the same behaviour:

- the `openai` client library does the HTTP: per-request timeout (`timeout_s`) and retries with exponential backoff on
  connection errors, 408/409/429 and 5xx answers (`max_retries`);
- the API key comes from the environment variable named by `api_key_env` (a local `vllm serve` needs none, so a
  missing variable sends the placeholder "EMPTY", as vLLM's docs do);
- `model=null` asks the server for its model list and takes the only one (an error names them when there are several);
- a failure after the retries is an `EndpointError` that names the URL, the model and what to check, never a hang;
- `map_concurrently` runs many requests with at most `concurrency` in flight and a progress bar.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")
R = TypeVar("R")


class EndpointError(RuntimeError):
    """A request to an OpenAI-compatible endpoint failed after its retries."""


@dataclass
class EndpointConfig:
    # Server root, e.g. http://127.0.0.1:8000/v1 (the /v1 suffix is added when missing).
    base_url: str
    # Served model name; null = the server's only model.
    model: str | None = None
    # Environment variable that holds the API key; unset = "EMPTY" (what a local vllm serve accepts).
    api_key_env: str = "OPENAI_API_KEY"
    # Seconds one request may take before it is retried.
    timeout_s: float = 120.0
    # Retries (exponential backoff) on connection errors, timeouts, 429 and 5xx answers.
    max_retries: int = 3
    # Requests in flight at once.
    concurrency: int = 8

    @classmethod
    def from_dict(cls, section: Any, where: str) -> EndpointConfig:
        """Build from a config section (DictConfig or dict); `where` names it in errors (e.g. "judge")."""
        values = dict(section or {})
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            known = ", ".join(cls.__dataclass_fields__)
            raise ValueError(f"{where}: unknown key(s) {unknown}; an endpoint takes {known}")
        if not values.get("base_url"):
            raise ValueError(
                f"{where}.base_url is not set: give the server's URL, e.g. {where}.base_url=http://127.0.0.1:8000/v1"
            )
        config = cls(**values)
        rules = (
            (config.timeout_s > 0, "timeout_s", "> 0"),
            (config.max_retries >= 0, "max_retries", ">= 0"),
            (config.concurrency >= 1, "concurrency", ">= 1"),
        )
        broken = [f"{where}.{key}={getattr(config, key)} must be {rule}" for ok, key, rule in rules if not ok]
        if broken:
            raise ValueError("; ".join(broken))
        return config


def _v1_url(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class Endpoint:
    """A client for one server and model. Thread-safe: `map_concurrently` calls it from several threads."""

    def __init__(self, config: EndpointConfig):
        import openai

        self.config = config
        self.url = _v1_url(config.base_url)
        self._openai = openai
        self.client = openai.OpenAI(
            base_url=self.url,
            api_key=os.environ.get(config.api_key_env) or "EMPTY",
            timeout=config.timeout_s,
            max_retries=config.max_retries,
        )
        self._model = config.model

    @property
    def model(self) -> str:
        if self._model is None:
            names = [m.id for m in self._call("list the models", self.client.models.list).data]
            if len(names) != 1:
                raise EndpointError(
                    f"{self.url} serves {names or 'no models'}; set the endpoint's model to one of them"
                )
            self._model = names[0]
        return self._model

    def _call(self, what: str, fn: Callable[..., R], **kwargs: Any) -> R:
        try:
            return fn(**kwargs)
        except self._openai.APIStatusError as err:
            raise EndpointError(
                f"{self.url}: {what} failed with HTTP {err.status_code} after {self.config.max_retries} retries: "
                f"{str(err)[:300]}"
            ) from err
        except self._openai.APITimeoutError as err:
            raise EndpointError(
                f"{self.url}: {what} timed out ({self.config.timeout_s:g} s per request, {self.config.max_retries} "
                "retries); raise the endpoint's timeout_s or check that the server is not overloaded"
            ) from err
        except self._openai.APIConnectionError as err:
            raise EndpointError(
                f"{self.url}: {what} could not connect after {self.config.max_retries} retries ({err.__cause__ or err}); "
                "is the server running, and is base_url right?"
            ) from err

    def complete(self, prompt: str | list[int], **sampling: Any):
        """POST /v1/completions; returns the openai `Completion` (choices[i].text, .finish_reason, .stop_reason)."""
        return self._call("a completion", self.client.completions.create, model=self.model, prompt=prompt, **sampling)

    def chat(self, messages: list[dict[str, str]], **sampling: Any) -> str:
        """POST /v1/chat/completions; returns the first choice's text."""
        reply = self._call(
            "a chat completion", self.client.chat.completions.create, model=self.model, messages=messages, **sampling
        )
        return reply.choices[0].message.content or ""


def map_concurrently(fn: Callable[[T], R], items: Iterable[T], concurrency: int, desc: str | None = None) -> list[R]:
    """`[fn(x) for x in items]` with at most `concurrency` calls in flight, results in input order, a tqdm bar when
    `desc` is given. The first exception is raised once the calls in flight have finished."""
    items = list(items)
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(items) or 1))) as pool:
        results = pool.map(fn, items)
        return list(tqdm(results, total=len(items), desc=desc, disable=desc is None))
