"""`rollout.name=openai`: the rollout engine interface on a served model (`vllm serve`, or any OpenAI-compatible
completions server that returns token ids), for evaluating a trained checkpoint as ARPO's evaluation does.

`main_generation` and its agent loop (`rollout.mode=sync_with_tool`: stops at tool tags, tool results appended, call
limit) run unchanged on top: each request is the loop's token ids, sent as they are (a token-id prompt, so the server
sees exactly the tokens the HF engine would and greedy decoding gives the same text), and each reply's generated token
ids come back through vLLM's `return_token_ids` extension, the token that completed a stop string or the EOS included,
as the other engines return them. Requests go out concurrently, at most `rollout.endpoint.concurrency` at a time, each
with the endpoint's timeout and retries (`verl/utils/openai_endpoint.py`).

What a served model cannot do here: take new weights (training needs `hf` or `vllm`), and return log-probs or
entropies (the server is not asked for them; `CompletionOutput.log_probs` / `entropies` are NaN). ARPO / AEPO
branching, which measures the entropy of every segment, therefore refuses to run on this engine; evaluation
(`main_generation`) never branches.

Sampled (not greedy) requests carry a seed, `rollout.seed` plus the request's number in this engine, so a rerun of the
same job against the same server draws the same samples while identical requests (the n trajectories of a prompt in
the agent loop) still draw different ones.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import Any

import torch

from verl.utils.openai_endpoint import Endpoint, EndpointConfig, EndpointError, map_concurrently
from verl.workers.rollout.base import CompletionOutput, RolloutEngine, SamplingParams, params_per_prompt
from verl.workers.rollout.registry import register_rollout
from verl.workers.rollout.served import checked_finish_reason, config_value

_NOT_TRAINABLE = (
    "rollout.name=openai generates with a model served elsewhere and cannot receive the actor's weights; "
    "train with rollout.name=hf or vllm and use openai to evaluate the saved model (main_generation)"
)


@register_rollout("openai")
class OpenAIRollout(RolloutEngine):
    """Generation requests sent to an OpenAI-compatible `/v1/completions` endpoint.

    endpoint: the server's client; the caller's tokenizer must be the served model's (prompts are token ids).
    seed: base of the per-request sampling seeds (None: unseeded). ignore_eos: keep generating past EOS.
    """

    def __init__(self, endpoint: Endpoint, seed: int | None = None, ignore_eos: bool = False):
        self.endpoint = endpoint
        self.seed = seed
        self.ignore_eos = ignore_eos
        self._request_numbers = itertools.count()

    @classmethod
    def build(
        cls,
        *,
        model_path,
        tokenizer,
        config,
        device,
        seed,
        load_module,
        weights_follow,
        tokenizer_path=None,
        trust_remote_code=False,
        hf_overrides=None,
    ) -> OpenAIRollout:
        """See `RolloutEngine.build`: the endpoint is `config.endpoint` (`EndpointConfig`'s keys); the model at
        `model_path` is not loaded: the server holds the model, and the caller tokenizes with its tokenizer."""
        if weights_follow:
            raise ValueError(_NOT_TRAINABLE)
        endpoint = EndpointConfig.from_dict(config_value(config, "endpoint", None), "rollout.endpoint")
        return cls(Endpoint(endpoint), seed=seed, ignore_eos=bool(config_value(config, "ignore_eos")))

    def generate(
        self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[CompletionOutput]]:
        """See `RolloutEngine.generate`: one request per prompt (its `n` completions in one reply), concurrently."""
        per_prompt = params_per_prompt(params, len(prompt_token_ids))
        if any(p.logprobs for p in per_prompt):
            raise ValueError(
                "rollout.name=openai returns no log-probs, and ARPO/AEPO branching needs the entropy of every segment "
                "(actor_rollout_ref.rollout.beam_size > 1); evaluate without branching (main_generation never "
                "branches) or use rollout.name=hf or vllm"
            )
        requests = [
            (list(map(int, ids)), p, next(self._request_numbers)) for ids, p in zip(prompt_token_ids, per_prompt)
        ]
        return map_concurrently(self._complete, requests, self.endpoint.config.concurrency)

    def _complete(self, request: tuple[list[int], SamplingParams, int]) -> list[CompletionOutput]:
        ids, params, number = request
        if not ids:
            raise ValueError(f"request {number} has an empty prompt; a completion needs at least one prompt token")
        reply = self.endpoint.complete(ids, **self._request_body(params, number))
        choices = sorted(reply.choices, key=lambda choice: choice.index)
        if len(choices) != params.n:
            raise EndpointError(f"{self.endpoint.url} returned {len(choices)} completions for n={params.n}")
        return [self._completion(choice) for choice in choices]

    def _request_body(self, params: SamplingParams, number: int) -> dict[str, Any]:
        """The completion request's arguments: OpenAI's names, vLLM's extensions in `extra_body`."""
        extra: dict[str, Any] = {"return_token_ids": True}
        body: dict[str, Any] = {"n": params.n, "max_tokens": params.max_tokens, "extra_body": extra}
        if params.greedy:
            body["temperature"] = 0.0
        else:
            body.update(temperature=params.temperature, top_p=params.top_p)
            if params.top_k > 0:
                extra["top_k"] = params.top_k
            if self.seed is not None:
                body["seed"] = self.seed + number
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            extra["stop_token_ids"] = list(params.stop_token_ids)
        if params.include_stop_str_in_output:
            extra["include_stop_str_in_output"] = True
        if self.ignore_eos:
            extra["ignore_eos"] = True
        return body

    def _completion(self, choice) -> CompletionOutput:
        """Our CompletionOutput from one reply choice (vLLM's extra fields `token_ids` and `stop_reason`)."""
        extra = choice.model_extra or {}
        token_ids = extra.get("token_ids")
        if token_ids is None:
            raise EndpointError(
                f"{self.endpoint.url} returned no token ids; rollout.name=openai needs a server that returns them "
                "when asked with return_token_ids=true (vLLM's OpenAI server does)"
            )
        finish_reason = checked_finish_reason(choice.finish_reason, self.endpoint.url, error=EndpointError)
        nan = [math.nan] * len(token_ids)
        return CompletionOutput(list(token_ids), nan, list(nan), finish_reason, extra.get("stop_reason"))

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError(_NOT_TRAINABLE)

    def sleep(self) -> None:
        """Nothing to free: the model lives in the server."""

    def wake_up(self) -> None:
        """Nothing to restore (see `sleep`)."""
