"""What the engines share beyond the interface: reading the rollout config (`config_value`), and what the served
engines -- vLLM, SGLang, TensorRT-LLM, whose model runs outside a torch module of ours -- do alike: read their
engine arguments, refuse empty prompts, receive weights in buckets, remember the checksum of the last push, and turn
their outputs' log-probs and finish reasons into a `CompletionOutput`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from verl.utils.config import default_of
from verl.utils.torch_functional import tensor_checksum
from verl.workers.rollout.base import RolloutEngine

_SHIPPED = object()


def config_value(config, key: str, default=_SHIPPED):
    """`key` of an engine's rollout config (a dict, an OmegaConf node or an attribute-style object; None = no
    config). A missing or null key gives `default`, or when none is given the shipped default of
    `actor_rollout_ref.rollout.<key>` (the YAML is the one place defaults are written)."""
    value = None
    if config is not None:
        value = config.get(key) if hasattr(config, "get") else getattr(config, key, None)
    if value is not None:
        return value
    return default_of(f"actor_rollout_ref.rollout.{key}") if default is _SHIPPED else default


def engine_load_format(config, weights_follow: bool) -> str:
    """`rollout.load_format`, except that "dummy" (placeholder weights) becomes "auto" (read the checkpoint) when no
    actor pushes weights after each update (`weights_follow` false): nobody would ever replace the placeholders."""
    load_format = config_value(config, "load_format")
    return "auto" if load_format == "dummy" and not weights_follow else load_format


def engine_extra_kwargs(config, engine: str) -> dict:
    """`rollout.engine_kwargs.<engine>` as a plain dict: the engine's own arguments, passed through as they are."""
    from omegaconf import DictConfig, OmegaConf

    extra = (config_value(config, "engine_kwargs") or {}).get(engine) or {}
    return OmegaConf.to_container(extra, resolve=True) if isinstance(extra, DictConfig) else dict(extra)


def engine_max_model_len(config, hf_config) -> int | None:
    """`rollout.max_model_len`, else prompt + response length within the model's positions (None: unknown, the
    engine's own default)."""
    length = config_value(config, "max_model_len")
    if length is not None:
        return int(length)
    total = int(config_value(config, "prompt_length", 0)) + int(config_value(config, "response_length", 0))  # 0: unknown
    positions = getattr(hf_config, "max_position_embeddings", None)
    return min(total, positions) if total and positions else (total or None)


def check_prompts_not_empty(prompt_token_ids: list[list[int]], engine: str) -> None:
    """A served engine needs at least one token per prompt; name the first prompt without."""
    for i, ids in enumerate(prompt_token_ids):
        if len(ids) == 0:
            raise ValueError(f"prompt {i} is empty; the {engine} engine needs at least one prompt token")


class WeightBuckets:
    """The actor's (HF name, tensor) pairs as an engine receives them: each tensor whole (FSDP2 DTensors gathered),
    detached and contiguous, on `device` when one is given. Iterating yields (bucket, last): lists of pairs of about
    `bucket_bytes` (a larger tensor alone), each yielded when the next tensor would overflow it, so one bucket is
    held at a time; `pairs()` yields the pairs one at a time instead. `checksum` (the `tensor_checksum` of every
    tensor, summed on their device and read once) is set when the iteration ends."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 0,
                 device: str | torch.device | None = None):
        self.named_tensors, self.bucket_bytes, self.device = named_tensors, bucket_bytes, device
        self.checksum: float | None = None

    def pairs(self):
        """The pairs one at a time, for an engine that streams them (vLLM's in-place loader)."""
        total = None
        for name, tensor in self.named_tensors:
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            tensor = tensor.detach()
            if self.device is not None:
                tensor = tensor.to(self.device)
            tensor = tensor.contiguous()
            total = tensor_checksum(tensor) if total is None else total + tensor_checksum(tensor)
            yield name, tensor
        self.checksum = 0.0 if total is None else float(total)

    def __iter__(self):
        bucket, size = [], 0
        for name, tensor in self.pairs():
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > self.bucket_bytes:
                yield bucket, False
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += nbytes
        if bucket:
            yield bucket, True


def entropy_from_top_log_probs(log_probs: Iterable[float]) -> float:
    """-sum exp(l) l over the given log-probs; tokens a top-k / top-p filter removed (-inf) add nothing."""
    return -sum(math.exp(lp) * lp for lp in log_probs if math.isfinite(lp))


def token_entropies(log_probs: list[float], top: list[list[float]] | None) -> list[float]:
    """Each generated token's entropy: from its top log-probs when the engine returned them (`SamplingParams.logprobs`;
    ARPO's top-k estimate), else -log p of the sampled token (a one-sample estimate)."""
    if top is not None:
        return [entropy_from_top_log_probs(values) for values in top]
    return [-log_prob for log_prob in log_probs]


def checked_finish_reason(reason, engine: str, reported=None, error: type[Exception] = RuntimeError) -> str:
    """An engine's finish reason as the interface has it ("stop" or "length"); any other (an abort, an error) is
    raised as `error`, naming `engine` and what it reported (`reported`, when `reason` was read out of it)."""
    if reason not in ("stop", "length"):
        raise error(f"{engine} ended a completion with finish_reason={reason if reported is None else reported!r}")
    return reason


class PushedWeightsEngine(RolloutEngine):
    """An engine whose weights cannot be read back here (they live in the engine's process, or its kernels repack
    them): `update_weights` sets `pushed_checksum` (`WeightBuckets.checksum`), which `weights_checksum` reports."""

    pushed_checksum: float | None = None

    def weights_checksum(self) -> float:
        """The sum of the weights last pushed; NaN before the first push."""
        return math.nan if self.pushed_checksum is None else self.pushed_checksum
