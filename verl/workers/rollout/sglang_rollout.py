r"""A rollout engine on SGLang's offline `Engine`, one per rank, next to the FSDP actor (CUDA only).

SGLang runs its scheduler in a child process on the rank's GPU; this process holds the `Engine` handle that sends it
requests. What it adds to the engine interface of `base.py`:

**Weights.** With `rollout.load_format=dummy` (the default when an actor pushes weights) SGLang starts from random
weights; `update_weights` sends the actor's full tensors with `Engine.update_weights_from_tensor`, in buckets of about
BUCKET_BYTES (CUDA tensors travel as CUDA IPC handles, so a bucket costs no copy), inside the weight-update session
SGLang 0.5.23 asks for (`begin_weight_update` / `end_weight_update`, called where the installed SGLang has them).
The last bucket flushes the prefix cache, computed with the old weights.

**One engine per rank.** No tensor parallelism: `rollout.tensor_model_parallel_size` must be 1 (use rollout.name=vllm
for tensor-parallel rollout). Each rank's engine serves that rank's prompts; `run_in_tp_group` is the default one.

**Log-probs and entropies.** SGLang's sampler returns log softmax(z / T), the log of the temperature-scaled
distribution it hands to its top-k / top-p filters (sglang/srt/layers/sampler.py) -- the same quantity the actor
recomputes, as with vLLM's `processed_logprobs`; with top-k / top-p on, it is the distribution before filtering (vLLM
reports the renormalised one). Greedy requests (temperature 0, which SGLang runs as top_k=1 at T=1) get log softmax(z).
SGLang computes no full-vocabulary entropies; the `entropies` of a completion are vLLM's engine's estimates, per token

    H_t ~ -sum_{v in L_t} exp(l_v) l_v     with top log-probs (`SamplingParams.logprobs`): L_t = the top-k log-probs
                                           plus the sampled token's when it is not among them (ARPO's estimate);
    H_t ~ -log p(x_t)                      otherwise: the sampled token's surprisal.

**Memory.** `rollout.free_cache_engine=true` starts SGLang with its memory saver and releases the weights, the KV
cache and the CUDA graphs between rollouts (`sleep`). When the actor pushes weights (`weights_follow`), the released
weights are simply gone: the next push brings them back (`update_weights` resumes their memory first) and `wake_up`
restores the rest. Otherwise SGLang keeps a host copy of the weights (`enable_weights_cpu_backup`) and `wake_up`
restores everything.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import torch

from verl.utils.memory import NO_CLAIM, EngineClaim, EngineContext, gpu_share_claim
from verl.workers.rollout.base import CompletionOutput, SamplingParams, params_per_prompt
from verl.workers.rollout.registry import register_rollout
from verl.workers.rollout.selection import cuda_only_engine_problems, cuda_only_engine_refusals
from verl.workers.rollout.served import (
    PushedWeightsEngine,
    WeightBuckets,
    check_prompts_not_empty,
    checked_finish_reason,
    config_value,
    engine_extra_kwargs,
    engine_load_format,
    engine_max_model_len,
    token_entropies,
)

# Bytes of weights sent per update_weights_from_tensor call: large enough that the per-call round trip to the
# scheduler does not count, small enough that a bucket of host tensors (sent through shared memory) stays modest.
BUCKET_BYTES = 512 << 20
# What `sleep` releases: SGLang's memory-saver tags.
_RELEASED_TAGS = ("weights", "kv_cache", "cuda_graph")
_PREFIX = "actor_rollout_ref.rollout"


def config_problems(rollout, device: str, n_ranks: int, prefix: str) -> list[str]:
    """What stops `rollout.name=sglang` from running with this rollout config on `device` ("cpu" or "cuda") and
    `n_ranks` ranks, as messages naming the keys."""
    return cuda_only_engine_problems("sglang", rollout, device, n_ranks, prefix)


def _check(result, what: str) -> None:
    """SGLang's control calls answer (success, message); raise on a failure."""
    if isinstance(result, tuple) and len(result) == 2 and not result[0]:
        raise RuntimeError(f"SGLang's {what} failed: {result[1]}")


@register_rollout("sglang")
class SGLangRollout(PushedWeightsEngine):
    """SGLang behind the engine interface (see the module docstring).

    model_path / tokenizer_path: local HF directories (SGLang loads its own tokenizer, for stop strings). config: the
    rollout config node (`tensor_model_parallel_size`, `gpu_memory_utilization`, `max_model_len`, `dtype`,
    `free_cache_engine`, `ignore_eos`, `engine_kwargs.sglang`; missing keys take defaults). device: a CUDA device.
    seed: SGLang's random seed. load_format: "dummy" (random weights until `update_weights`) or "auto" (read the
    checkpoint). weights_follow: the caller pushes weights after every actor update (see **Memory**).
    """

    def __init__(
        self,
        model_path: str,
        config=None,
        device: str | torch.device = "cuda",
        seed: int = 0,
        load_format: str = "auto",
        tokenizer_path: str | None = None,
        trust_remote_code: bool = False,
        hf_overrides: dict | None = None,
        weights_follow: bool = False,
    ):
        self.device = torch.device(device)
        refusals = cuda_only_engine_refusals("sglang", self.device.type,
                                             config_value(config, "tensor_model_parallel_size"), _PREFIX)
        if refusals:
            raise ValueError(refusals[0])
        from sglang.srt.entrypoints.engine import Engine
        from transformers import AutoConfig

        self.ignore_eos = bool(config_value(config, "ignore_eos"))
        self.weights_follow = weights_follow
        self.can_sleep = bool(config_value(config, "free_cache_engine"))
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code, **(hf_overrides or {}))
        kwargs: dict[str, Any] = dict(
            model_path=model_path,
            tokenizer_path=tokenizer_path or model_path,
            trust_remote_code=trust_remote_code,
            dtype=config_value(config, "dtype"),
            load_format=load_format,
            random_seed=seed,
            tp_size=1,
            mem_fraction_static=float(config_value(config, "gpu_memory_utilization")),
            context_length=engine_max_model_len(config, hf_config),
            # Ray shows each worker only its own GPU, which is then the current device.
            base_gpu_id=self.device.index if self.device.index is not None else torch.cuda.current_device(),
            enable_memory_saver=self.can_sleep,
        )
        if self.can_sleep and not weights_follow:  # released weights nobody pushes again come back from host memory
            kwargs["enable_weights_cpu_backup"] = True
        if hf_overrides:
            kwargs["json_model_override_args"] = json.dumps(hf_overrides)
        kwargs.update(engine_extra_kwargs(config, "sglang"))
        self.engine = Engine(**kwargs)
        self._released: set[str] = set()

    @classmethod
    def build(cls, *, model_path, tokenizer, config, device, seed, load_module, weights_follow, tokenizer_path=None,
              trust_remote_code=False, hf_overrides=None) -> SGLangRollout:
        """See `RolloutEngine.build`: SGLang reads the checkpoint itself, or with `load_format=dummy` and an actor
        pushing weights (`weights_follow`), starts from placeholders and never reads it."""
        return cls(model_path, config, device, seed=seed or 0, load_format=engine_load_format(config, weights_follow),
                   tokenizer_path=tokenizer_path,
                   trust_remote_code=trust_remote_code, hf_overrides=hf_overrides, weights_follow=weights_follow)

    # ---- generation -------------------------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[CompletionOutput]]:
        """See `RolloutEngine.generate`. Per-prompt params may differ in anything. Each of a prompt's n completions
        is its own SGLang request (n=1), so the results map to prompts by position."""
        per_prompt = params_per_prompt(params, len(prompt_token_ids))
        check_prompts_not_empty(prompt_token_ids, "SGLang")
        if self.weights_released:
            raise RuntimeError("SGLangRollout.generate: the weights were released by sleep(); push them first "
                               "(update_weights)")
        requests = [(list(map(int, ids)), p) for ids, p in zip(prompt_token_ids, per_prompt) for _ in range(p.n)]
        if not requests:
            return []
        outputs = self.engine.generate(input_ids=[ids for ids, _ in requests],
                                       sampling_params=[self._sglang_params(p) for _, p in requests],
                                       return_logprob=True, top_logprobs_num=[p.logprobs or 0 for _, p in requests])
        if len(outputs) != len(requests):
            raise RuntimeError(f"SGLang returned {len(outputs)} outputs for {len(requests)} requests")
        completions = iter([self._completion(out, p) for out, (_, p) in zip(outputs, requests)])
        return [[next(completions) for _ in range(p.n)] for p in per_prompt]

    def _sglang_params(self, params: SamplingParams) -> dict:
        """One request's SGLang sampling params (sglang/srt/sampling/sampling_params.py)."""
        return {
            "n": 1,
            "max_new_tokens": params.max_tokens,
            "temperature": 0.0 if params.greedy else params.temperature,
            "top_p": 1.0 if params.greedy else params.top_p,
            "top_k": params.top_k if params.top_k > 0 and not params.greedy else -1,  # SGLang: -1 = all
            "stop": params.stop,
            "stop_token_ids": params.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "no_stop_trim": params.include_stop_str_in_output,  # text only: the ids keep the stop token
        }

    @staticmethod
    def _completion(output: dict, params: SamplingParams) -> CompletionOutput:
        """Our CompletionOutput from one SGLang result: {"output_ids", "meta_info": {"finish_reason",
        "output_token_logprobs": [(logprob, id, text)], "output_top_logprobs": [[(logprob, id, text)] or None]}}."""
        meta = output["meta_info"]
        reason = meta.get("finish_reason") or {}
        finish_reason = checked_finish_reason(reason.get("type"), "SGLang", reported=reason)
        token_ids = [int(t) for t in output["output_ids"]]
        steps = meta["output_token_logprobs"]
        if len(steps) != len(token_ids):
            raise RuntimeError(f"SGLang returned {len(steps)} log-probs for {len(token_ids)} tokens")
        log_probs = [float(step[0]) for step in steps]
        top = None
        if params.logprobs:
            top = [_top_log_probs(candidates, token, log_prob) for candidates, token, log_prob
                   in zip(meta["output_top_logprobs"], token_ids, log_probs)]
        matched = reason.get("matched")
        # "matched" is the stop string, or the token id that stopped (EOS too, which the interface reports as None).
        stop_reason = matched if isinstance(matched, str) or matched in (params.stop_token_ids or ()) else None
        return CompletionOutput(token_ids, log_probs, token_entropies(log_probs, top), finish_reason, stop_reason,
                                top)

    # ---- weights and memory -----------------------------------------------------------------------------------

    @property
    def weights_released(self) -> bool:
        """Whether `sleep` dropped weights that only a push brings back (the worker pushes before generating)."""
        return self.weights_follow and "weights" in self._released

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send (HF name, full tensor) pairs to SGLang in buckets of about BUCKET_BYTES; sharded tensors (FSDP2
        DTensors) are gathered first."""
        if "weights" in self._released:
            self.engine.resume_memory_occupation(tags=["weights"])
            self._released.discard("weights")
        # A released KV cache was flushed when it was released.
        flush = "kv_cache" not in self._released
        begin = getattr(self.engine, "begin_weight_update", None)  # SGLang before 0.5.23 has no update sessions
        if begin is not None:
            _check(begin(), "begin_weight_update")
        buckets = WeightBuckets(named_tensors, BUCKET_BYTES)
        try:
            for bucket, last in buckets:  # only the last call drops the prefix cache
                _check(self.engine.update_weights_from_tensor(bucket, flush_cache=flush and last),
                       "update_weights_from_tensor")
        finally:
            if begin is not None:
                _check(self.engine.end_weight_update(), "end_weight_update")
        self.pushed_checksum = buckets.checksum  # the weights live in SGLang's process

    def sleep(self) -> None:
        """With free_cache_engine: release the weights, the KV cache and the CUDA graphs (SGLang's memory saver)."""
        if self.can_sleep and not self._released:
            self.engine.release_memory_occupation(tags=list(_RELEASED_TAGS))
            self._released = set(_RELEASED_TAGS)

    def wake_up(self) -> None:
        """Restore what `sleep` released, except weights that await a push (`weights_released`)."""
        awaiting_push = {"weights"} if self.weights_follow else set()
        tags = [tag for tag in _RELEASED_TAGS if tag in self._released - awaiting_push]
        if tags:
            self.engine.resume_memory_occupation(tags=tags)
            self._released.difference_update(tags)

    @classmethod
    def memory_claim(cls, ctx: EngineContext) -> EngineClaim:
        """Its mem_fraction_static (rollout.gpu_memory_utilization) of the GPU; it runs on CUDA only."""
        return gpu_share_claim(ctx, "sglang") if ctx.cuda else NO_CLAIM


def _top_log_probs(candidates, token: int, log_prob: float) -> list[float]:
    """One token's top log-probs as the interface has them: the top-k, then the sampled token's when it is not
    among them. SGLang gives (logprob, id, text) triples, or None at a position without them."""
    candidates = candidates or []
    values = [float(entry[0]) for entry in candidates]
    if token not in {int(entry[1]) for entry in candidates}:
        values.append(log_prob)
    return values
