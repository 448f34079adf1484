r"""A rollout engine on TensorRT-LLM's `LLM` (PyTorch backend), one per rank, next to the FSDP actor (CUDA only).

TensorRT-LLM receives new weights only through its Ray orchestrator (`orchestrator_type="ray"`): the engine then runs
in a Ray actor of its own, and this process holds the `LLM` handle that sends it requests and control calls
(`LLM._collective_rpc`, which TensorRT-LLM marks as a prototype). Read against TensorRT-LLM's main branch
(tensorrt_llm/llmapi/llm.py, llm_args.py, rlhf_utils.py, executor/ray_executor.py, executor/ray/gpu_worker.py,
executor/params/sampling.py, executor/result.py). What it adds to the engine interface of `base.py`:

**Weights.** With `rollout.load_format=dummy` (the default when an actor pushes weights) the engine starts from random
weights. `update_weights` sends the actor's full tensors in buckets of about BUCKET_BYTES as CUDA IPC handles keyed
by this GPU's UUID -- nothing is copied -- to `update_weights` of TensorRT-LLM's RL worker extension
(WORKER_EXTENSION), which loads them into the running model; a last call without handles runs the model's
post-loading hooks and drops the prefix cache. The engine's Ray actor must therefore sit on this rank's GPU: inside a
worker group it takes a share of the rank's placement-group bundle equal to this worker's own (see `_placement`), so
the resource pool must leave one (Quiver's pool gives a rank's processes 1 / max_colocate_count of its GPU each).

**One engine per rank.** No tensor parallelism: the IPC handles only reach a worker on this rank's GPU, so
`rollout.tensor_model_parallel_size` must be 1 (rollout.name=vllm runs tensor-parallel groups).

**Log-probs and entropies.** TensorRT-LLM reports log-probs of the distribution it samples from when a request asks
for `logprobs_mode="processed"`: log softmax(z / T), renormalised over what top-k / top-p keep when they are on (as
vLLM's `processed_logprobs`) -- what the actor recomputes while they are off. Greedy requests ask for "raw", log
softmax(z). TensorRT-LLM computes no full-vocabulary entropies; the `entropies` of a completion are vLLM's engine's
estimates, per token

    H_t ~ -sum_{v in L_t} exp(l_v) l_v     with top log-probs (`SamplingParams.logprobs`): L_t = the top-k log-probs
                                           plus the sampled token's when it is not among them (ARPO's estimate);
    H_t ~ -log p(x_t)                      otherwise: the sampled token's surprisal.

Stop strings are matched as the token ids the tokenizer gives them (TensorRT-LLM's rule), not as decoded text.

**Memory.** `rollout.free_cache_engine=true` starts TensorRT-LLM with its sleep feature and releases the KV cache
between rollouts (`sleep`); `wake_up` maps it again and drops the prefix cache, whose blocks came back empty. The
weights stay resident: which of TensorRT-LLM's other memory tags come back with their contents differs between its
versions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

import torch

from verl.utils.fsdp_utils import COMPUTE_DTYPES
from verl.utils.memory import DTYPE_BYTES, NO_CLAIM, EngineClaim, EngineContext
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

# Bytes of weights sent per update call: enough that the round trip to the engine's actor does not count, few enough
# that the handles of one bucket stay a short message.
BUCKET_BYTES = 512 << 20
# TensorRT-LLM's worker extension that loads weights from CUDA IPC handles (tensorrt_llm/llmapi/rlhf_utils.py).
WORKER_EXTENSION = "tensorrt_llm.llmapi.rlhf_utils.WorkerExtension"
# What `sleep` releases: TensorRT-LLM's memory tag of the KV cache.
RELEASED_TAGS = ("kv_cache",)
_NAME = "TensorRT-LLM"
_PREFIX = "actor_rollout_ref.rollout"


def config_problems(rollout, device: str, n_ranks: int, prefix: str) -> list[str]:
    """What stops `rollout.name=trtllm` from running with this rollout config on `device` ("cpu" or "cuda") and
    `n_ranks` ranks, as messages naming the keys."""
    return cuda_only_engine_problems("trtllm", rollout, device, n_ranks, prefix)


def _device_uuid(device: torch.device) -> str:
    """The GPU's UUID as TensorRT-LLM's workers look themselves up in the weight handles."""
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def _ipc_handle(tensor: torch.Tensor):
    """(rebuild function, its arguments): what another process on this GPU opens the tensor's memory with."""
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(tensor)


def _placement(llm_args) -> dict:
    """Where the engine's Ray actor goes: inside a worker group, this rank's bundle of its placement group (the
    LOCAL_RANK-th: the worker group puts rank r of a node in bundle r), with this worker's share of the GPU. Outside
    Ray, TensorRT-LLM starts a Ray of its own and takes one GPU (empty kwargs)."""
    import ray

    group = ray.util.get_current_placement_group() if ray.is_initialized() else None
    if group is None:
        return {}
    share = ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0)
    if not 0 < share < 1:
        raise ValueError(
            f"{_PREFIX}.name=trtllm: {_NAME} runs its engine in a Ray actor of its own, which must share this rank's "
            f"GPU to receive the weights in place, but this worker holds {share:g} of its placement-group bundle's "
            "GPU, which leaves nothing to share. The resource pool must count one more process per rank "
            "(max_colocate_count) for the TensorRT-LLM engine.")
    bundle = int(os.environ.get("LOCAL_RANK", "0"))
    return {"ray_placement_config": llm_args.RayPlacementConfig(
        placement_groups=[group], placement_bundle_indices=[[bundle]], per_worker_gpu_share=share)}


def _sleep_kwargs(llm_args) -> dict:
    """The `LLM` argument that turns the sleep feature on: a `sleep_config` in recent TensorRT-LLM, `enable_sleep`
    in the releases before it."""
    if "sleep_config" in llm_args.TorchLlmArgs.model_fields:
        return {"sleep_config": llm_args.SleepConfig()}
    return {"enable_sleep": True}


def _top_log_probs(step: dict) -> list[float]:
    """One position's log-probs as the interface has them: the top-k, then the sampled token's when it is not among
    them. TensorRT-LLM gives {token id: Logprob} for the top-k plus the sampled token when it is not among them, whose
    log-prob is then below theirs: sorting puts every value in its place."""
    return sorted((entry.logprob for entry in step.values()), reverse=True)


@register_rollout("trtllm")
class TRTLLMRollout(PushedWeightsEngine):
    """TensorRT-LLM behind the engine interface (see the module docstring).

    model_path / tokenizer_path: local HF directories (TensorRT-LLM loads its own tokenizer, for EOS and stop
    strings). config: the rollout config node (`tensor_model_parallel_size`, `gpu_memory_utilization`, which
    TensorRT-LLM applies to the memory free after loading the model, `max_model_len`, `max_num_seqs`,
    `max_num_batched_tokens`, `enable_prefix_caching`, `enforce_eager`, `dtype`, `free_cache_engine`, `ignore_eos`,
    `engine_kwargs.trtllm`; missing keys take defaults). device: a CUDA device. load_format: "dummy" (random weights
    until `update_weights`) or "auto" (read the checkpoint). There is no seed: TensorRT-LLM's `LLM` takes none, and
    its sampler seeds itself.
    """

    def __init__(
        self,
        model_path: str,
        config=None,
        device: str | torch.device = "cuda",
        load_format: str = "auto",
        tokenizer_path: str | None = None,
        trust_remote_code: bool = False,
        hf_overrides: dict | None = None,
    ):
        self.device = torch.device(device)
        refusals = cuda_only_engine_refusals("trtllm", self.device.type,
                                             config_value(config, "tensor_model_parallel_size"), _PREFIX)
        if refusals:
            raise ValueError(refusals[0])
        if hf_overrides:
            raise ValueError(f"actor_rollout_ref.model.override_config={hf_overrides}: {_NAME}'s LLM takes no "
                             "config overrides; write them into the model's config.json, or use rollout.name=vllm")
        from tensorrt_llm import LLM
        from tensorrt_llm import SamplingParams as TRTSamplingParams
        from tensorrt_llm.llmapi import KvCacheConfig, llm_args
        from transformers import AutoConfig

        if "logprobs_mode" not in {f.name for f in fields(TRTSamplingParams)}:
            raise ValueError(f"this {_NAME} has no SamplingParams.logprobs_mode, without which its log-probs are "
                             "those of the raw logits, not of the temperature-scaled distribution sampled from; "
                             "install a newer TensorRT-LLM")
        self._trt_params = TRTSamplingParams
        self.ignore_eos = bool(config_value(config, "ignore_eos"))
        self.can_sleep = bool(config_value(config, "free_cache_engine"))
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        kwargs: dict[str, Any] = dict(
            model=model_path,
            tokenizer=tokenizer_path or model_path,
            trust_remote_code=trust_remote_code,
            dtype=config_value(config, "dtype"),
            tensor_parallel_size=1,
            load_format=load_format,
            max_seq_len=engine_max_model_len(config, hf_config),
            max_batch_size=int(config_value(config, "max_num_seqs")),
            max_num_tokens=int(config_value(config, "max_num_batched_tokens")),
            kv_cache_config=KvCacheConfig(
                free_gpu_memory_fraction=float(config_value(config, "gpu_memory_utilization")),
                enable_block_reuse=bool(config_value(config, "enable_prefix_caching"))),
            orchestrator_type="ray",
            ray_worker_extension_cls=WORKER_EXTENSION,
            **_placement(llm_args),
        )
        if config_value(config, "enforce_eager"):
            kwargs["cuda_graph_config"] = None
        if self.can_sleep:
            kwargs.update(_sleep_kwargs(llm_args))
        kwargs.update(engine_extra_kwargs(config, "trtllm"))
        self.llm = LLM(**kwargs)
        self._asleep = False

    @classmethod
    def build(cls, *, model_path, tokenizer, config, device, seed, load_module, weights_follow, tokenizer_path=None,
              trust_remote_code=False, hf_overrides=None) -> TRTLLMRollout:
        """See `RolloutEngine.build`: TensorRT-LLM reads the checkpoint itself, or with `load_format=dummy` and an
        actor pushing weights (`weights_follow`), starts from placeholders and never reads it. `seed` goes unused
        (see the class docstring)."""
        return cls(model_path, config, device, load_format=engine_load_format(config, weights_follow),
                   tokenizer_path=tokenizer_path, trust_remote_code=trust_remote_code, hf_overrides=hf_overrides)

    # ---- generation -------------------------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[CompletionOutput]]:
        """See `RolloutEngine.generate`. Per-prompt params may differ in anything. Each of a prompt's n completions
        is its own TensorRT-LLM request (n=1; its LLM API refuses n > 1 for greedy requests), so the results map to
        prompts by position."""
        per_prompt = params_per_prompt(params, len(prompt_token_ids))
        check_prompts_not_empty(prompt_token_ids, _NAME)
        requests = [(list(map(int, ids)), p) for ids, p in zip(prompt_token_ids, per_prompt) for _ in range(p.n)]
        if not requests:
            return []
        outputs = self.llm.generate([ids for ids, _ in requests], [self._trtllm_params(p) for _, p in requests],
                                    use_tqdm=False)
        completions = iter([self._completion(out.outputs[0], p) for out, (_, p) in zip(outputs, requests)])
        return [[next(completions) for _ in range(p.n)] for p in per_prompt]

    def _trtllm_params(self, params: SamplingParams):
        """One request's TensorRT-LLM sampling params (tensorrt_llm/executor/params/sampling.py). Greedy is top_k=1
        with temperature and top_p unset; otherwise top_k=0 means every token."""
        if params.greedy:
            sampling = dict(top_k=1, logprobs_mode="raw")
        else:
            sampling = dict(temperature=params.temperature, top_p=params.top_p, top_k=max(params.top_k, 0),
                            logprobs_mode="processed")
        return self._trt_params(
            n=1,
            max_tokens=params.max_tokens,
            stop=params.stop,
            stop_token_ids=params.stop_token_ids,
            include_stop_str_in_output=True,  # else TensorRT-LLM cuts the stop tokens off the ids too
            ignore_eos=self.ignore_eos,
            logprobs=params.logprobs or 1,  # at least the sampled token's, in every version's reading of the count
            detokenize=False,
            **sampling,
        )

    @staticmethod
    def _completion(output, params: SamplingParams) -> CompletionOutput:
        """Our CompletionOutput from a TensorRT-LLM CompletionOutput: `token_ids`, `logprobs` (one {token id:
        Logprob(logprob, rank)} per token), `finish_reason` and `stop_reason` (the stop string or stop token id)."""
        finish_reason = checked_finish_reason(output.finish_reason, _NAME)
        token_ids = [int(t) for t in output.token_ids]
        if len(output.logprobs) != len(token_ids):
            raise RuntimeError(f"{_NAME} returned {len(output.logprobs)} log-probs for {len(token_ids)} tokens")
        log_probs = [float(step[token].logprob) for step, token in zip(output.logprobs, token_ids)]
        top = [_top_log_probs(step) for step in output.logprobs] if params.logprobs else None
        return CompletionOutput(token_ids, log_probs, token_entropies(log_probs, top), finish_reason,
                                output.stop_reason, top)

    # ---- weights and memory -----------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send (HF name, full tensor) pairs to the engine's worker as CUDA IPC handles, in buckets of about
        BUCKET_BYTES; sharded tensors (FSDP2 DTensors) are gathered first. A bucket's tensors stay alive here until
        the worker has loaded them (each call returns when it has)."""
        device_uuid = _device_uuid(self.device)

        def send(bucket: list[tuple[str, torch.Tensor]]) -> None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the gathers and copies are written before another process reads
            handles = [(name, _ipc_handle(tensor)) for name, tensor in bucket]
            self.llm._collective_rpc("update_weights", args=({device_uuid: handles},))

        buckets = WeightBuckets(named_tensors, BUCKET_BYTES, device=self.device)
        for bucket, _ in buckets:
            send(bucket)
        # No handles: the worker runs the model's post-loading hooks and drops the prefix cache.
        self.llm._collective_rpc("update_weights", args=(None,))
        self.pushed_checksum = buckets.checksum  # the weights live in the engine's process

    def sleep(self) -> None:
        """With free_cache_engine: release the KV cache (TensorRT-LLM's sleep, tag "kv_cache")."""
        if self.can_sleep and not self._asleep:
            self.llm._collective_rpc("sleep", args=(list(RELEASED_TAGS),))
            self._asleep = True

    def wake_up(self) -> None:
        """Map the KV cache again; its blocks hold nothing, so the prefix cache pointing into them is dropped."""
        if self._asleep:
            self.llm._collective_rpc("wakeup", args=(list(RELEASED_TAGS),))
            self.llm._collective_rpc("reset_prefix_cache")
            self._asleep = False

    @classmethod
    def memory_claim(cls, ctx: EngineContext) -> EngineClaim:
        """On CUDA (its only device): its own copy of the weights in rollout.dtype, never released (sleep frees only
        the KV cache), and a KV cache of gpu_memory_utilization of what is free when it starts
        (free_gpu_memory_fraction), kept between rollouts without free_cache_engine."""
        if not ctx.cuda:
            return NO_CLAIM
        dtype_bytes = DTYPE_BYTES.get(COMPUTE_DTYPES.get(str(ctx.rollout.dtype), ""), 2)
        weights = dtype_bytes * ctx.actor.parameters // ctx.rollout.tensor_model_parallel_size
        free = max(0, ctx.capacity - ctx.resident_bytes - weights)
        kv_cache = {"trtllm KV cache (gpu_memory_utilization)": int(ctx.rollout.gpu_memory_utilization * free)}
        if ctx.rollout.free_cache_engine:
            return EngineClaim(resident={"trtllm weights": weights}, generate=kv_cache)
        return EngineClaim(resident={"trtllm weights": weights, **kv_cache})
