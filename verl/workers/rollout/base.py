"""The rollout engine interface: what the trainer and the agent loops ask of an inference engine.

Everything above this file -- the trainer's plain sampling step and the multi-turn agent loops -- talks to an engine
only through `RolloutEngine.generate` on token ids, so the HF engine and the vLLM engine are interchangeable. The
engines register by name in registry.py; layout.py turns their completions into the trainer's rollout batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from verl.utils.memory.claim import NO_CLAIM, EngineClaim, EngineContext


@dataclass
class SamplingParams:
    """How to sample one request. Names and defaults follow vLLM's `SamplingParams`.

    n: completions per prompt. temperature: 0 means greedy. top_p: nucleus mass kept (1 = off). top_k: tokens kept
    (-1 or 0 = off). max_tokens: generated tokens at most. stop: strings that end a completion. stop_token_ids: token
    ids that end a completion besides the tokenizer's EOS. include_stop_str_in_output: only affects decoded text (the
    token ids always keep the token that completed the stop string, as in vLLM). do_sample: False means greedy.
    logprobs: also return, per generated token, the log-probs of the `logprobs` most likely tokens and of the sampled
    one when it is not among them (vLLM's `logprobs`; ARPO's top-k entropy estimate reads them). None = not returned.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    do_sample: bool = True
    logprobs: int | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.n < 1:
            raise ValueError(f"SamplingParams.n={self.n} must be at least 1")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature} must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p={self.top_p} must be in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens={self.max_tokens} must be at least 1")
        if self.logprobs is not None and self.logprobs < 1:
            raise ValueError(f"SamplingParams.logprobs={self.logprobs} must be at least 1 (or None)")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0

    @classmethod
    def of_rollout(cls, rollout: Any, n: int = 1, validate: bool = False,
                   overrides: dict[str, Any] | None = None) -> SamplingParams:
        """The sampling a rollout config asks for (training's `actor_rollout_ref.rollout`, generation's `rollout`):
        its temperature, top-p, top-k, do_sample, stop strings and stop token ids, `response_length` tokens at most;
        with `validate`, `val_kwargs`' temperature, top-p, top-k and do_sample; then `overrides` (a call's
        meta_info: temperature, top_p, top_k, do_sample, max_tokens)."""
        params = dict(n=n, temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                      max_tokens=rollout.response_length, do_sample=rollout.do_sample,
                      stop=list(rollout.get("stop") or []) or None,
                      stop_token_ids=list(rollout.get("stop_token_ids") or []) or None)
        if validate:
            val = rollout.val_kwargs
            params.update(temperature=val.temperature, top_p=val.top_p, top_k=val.top_k, do_sample=val.do_sample)
        for key in ("temperature", "top_p", "top_k", "do_sample", "max_tokens"):
            if key in (overrides or {}):
                params[key] = overrides[key]
        return cls(**params)


@dataclass
class CompletionOutput:
    """One completion of one prompt.

    token_ids: the generated tokens, ending with the EOS / stop token or the token that completed a stop string.
    log_probs, entropies: one float per token of `token_ids`, from the distribution the token was sampled from.
    finish_reason: "stop" (EOS, stop token or stop string) or "length" (hit max_tokens).
    stop_reason: the stop string matched, the stop token id matched from `stop_token_ids`, or None (EOS or length).
    top_log_probs: with `SamplingParams.logprobs=k`, per token the log-probs of the top-k tokens plus the sampled
    token's when it is not among them (k or k + 1 values); else None.
    policy_version: the version of the weights that sampled it, where the caller counts them (versioned.py); None
    otherwise.
    """

    token_ids: list[int]
    log_probs: list[float]
    entropies: list[float]
    finish_reason: str
    stop_reason: str | int | None
    top_log_probs: list[list[float]] | None = None
    policy_version: int | None = None


@dataclass
class ScoredTokens:
    """`RolloutEngine.score` of one sequence of n tokens: `log_probs` `(n - 1,)`, the log-prob of token i + 1 after
    tokens 0..i; with top-k, `topk_log_probs` and `topk_ids` `(n - 1, k)`, position i's k most likely next tokens,
    most likely first."""

    log_probs: torch.Tensor
    topk_log_probs: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None


class RolloutEngine(ABC):
    """What the trainer and the agent loop need from an inference engine.

    The agent loop relies on: `generate` taking unpadded token ids (no chat template applied by the engine),
    returning exactly `params.n` completions per prompt in request order, and `token_ids` never containing tokens
    past the one that finished the completion. The trainer relies on: `update_weights` accepting the actor's full
    (unsharded) parameter names, and `sleep` / `wake_up` bracketing the training phase so the engine can free memory.
    """

    @abstractmethod
    def generate(
        self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[CompletionOutput]]:
        """Complete every prompt `params.n` times; the result's i-th list belongs to the i-th prompt.

        A list gives each prompt its own params (as vLLM's `LLM.generate` takes them); the agent loop passes one per
        trajectory, differing in `max_tokens` (each trajectory's remaining budget).
        """

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights, given as (HF parameter name, full tensor) pairs; may be a one-pass generator."""

    @abstractmethod
    def sleep(self) -> None:
        """Release memory (KV cache, weights) while the actor trains; `generate` is not called until `wake_up`."""

    @abstractmethod
    def wake_up(self) -> None:
        """Undo `sleep` before the next rollout."""

    # An engine that batches continuously sets `streams` and implements `add_request` / `step` (the agent loop's
    # server then feeds it request by request; vllm_rollout.VLLMRollout); the others are served in whole batches.
    streams: bool = False

    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> str:
        """Queue one request (n=1) into the running batch; returns the id `step` reports it by."""
        raise NotImplementedError(f"{type(self).__name__} does not batch continuously")

    def step(self) -> list[tuple[str, CompletionOutput]]:
        """Run one step over every queued and running request: (request id, completion) of those it finished."""
        raise NotImplementedError(f"{type(self).__name__} does not batch continuously")

    def score(self, sequences: list[list[int]], temperature: float = 1.0,
              topk: int = 0) -> list[ScoredTokens]:
        """Prompt log-probs: for each sequence, each token after the first scored given the tokens before it, from
        the engine's logits divided by `temperature` (a distillation teacher's pass, verl/trainer/ppo/distillation.py;
        nothing is sampled). With `topk`, also each position's k most likely tokens."""
        raise NotImplementedError(f"{type(self).__name__} does not score given tokens (no prompt log-probs)")

    def weights_checksum(self) -> float:
        """The sum of the engine's weights (float64), to check that a push arrived."""
        raise NotImplementedError(f"{type(self).__name__} does not report a weights checksum")

    @classmethod
    def build(cls, *, model_path: str, tokenizer, config, device: str, seed: int | None,
              load_module: Callable[[], torch.nn.Module], weights_follow: bool, tokenizer_path: str | None = None,
              trust_remote_code: bool = False, hf_overrides: dict | None = None) -> RolloutEngine:
        """The engine for the HF model at `model_path`, built the way this engine loads models.

        load_module: loads that model as a HF module (for engines that run one). weights_follow: the caller pushes
        weights with `update_weights` before the first `generate`, so the engine may start with placeholders.
        """
        raise NotImplementedError(f"{cls.__name__} cannot be built from a model path")

    def run_in_tp_group(self, local: Any, work: Callable[[list[Any]], list[Any]]) -> Any:
        """Run `work` on the items of every rank of this rank's tensor-parallel group; return this rank's result.

        Engines without tensor parallelism (a group of one) just run `work([local])`; see the vLLM engine.
        """
        return work([local])[0]

    # ---- optional capabilities: the defaults are an engine that has none; an engine opts in by overriding them

    # An engine split over a tensor-parallel group sets the group's size and this rank's place in it (vLLM's).
    tp_size: int = 1
    tp_rank: int = 0

    # An engine whose `sleep` frees weights that only a push brings back sets this while they are gone; the worker
    # then pushes before the next `generate` (hf_rollout.HFRollout, sglang_rollout.SGLangRollout).
    weights_released: bool = False

    # An engine whose own tensors can receive the actor's gathered shards sets `takes_weights_in_place` and implements
    # `weight_targets` and `check_all_written`; the worker then writes the weights straight into them instead of
    # calling `update_weights` (no full-size temporaries; hf_rollout.HFRollout). `push_destination`: the one rank
    # whose engine receives them (the others only send their shards), or None for every rank's own engine.
    takes_weights_in_place: bool = False
    push_destination: int | None = None

    def weight_targets(self) -> dict[str, torch.Tensor] | None:
        """The tensors, by HF parameter name, that a push writes into (None on a rank that only sends)."""
        raise NotImplementedError(f"{type(self).__name__} does not take weights in place")

    def check_all_written(self, written: set[str]) -> None:
        """After a push into `weight_targets`, fail unless `written` (the names written) covers what must be."""
        raise NotImplementedError(f"{type(self).__name__} does not take weights in place")

    @classmethod
    def memory_claim(cls, ctx: EngineContext) -> EngineClaim:
        """What the engine holds on a rank, for the memory estimate (verl/utils/memory/claim.py). By default nothing
        is counted: a remote server, or a user's engine that states nothing."""
        return NO_CLAIM


def params_per_prompt(params: SamplingParams | list[SamplingParams], n_prompts: int) -> list[SamplingParams]:
    """An engine's `generate` params as one SamplingParams per prompt (one shared, or a list of exactly n_prompts)."""
    per_prompt = params if isinstance(params, list) else [params] * n_prompts
    if len(per_prompt) != n_prompts:
        raise ValueError(f"{len(per_prompt)} sampling params for {n_prompts} prompts")
    return per_prompt
