"""The rollout engine interface and the one function that turns its output into a batch.

Everything above this file -- the trainer's plain sampling step and the multi-turn agent loop -- talks to an engine
only through `RolloutEngine.generate` on token ids, so the HF engine and the vLLM engine are interchangeable.
`generate_sequences` is the plain-sampling step: prompts `DataProto` in, rollout `DataProto` out, with the batch keys
listed in docs/internal_contracts.md.
"""

from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from verl.utils.config import default_of
from verl.utils.torch_functional import get_response_mask, pad_2d_list_to_tensor, tensor_checksum

if TYPE_CHECKING:
    from verl.protocol import DataProto


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
    """

    token_ids: list[int]
    log_probs: list[float]
    entropies: list[float]
    finish_reason: str
    stop_reason: str | int | None
    top_log_probs: list[list[float]] | None = None


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



_ROLLOUT_REGISTRY: dict[str, type[RolloutEngine]] = {}

# Engines shipped with Quiver, imported on first use so an engine's heavy dependency (vllm) is only needed when chosen.
_BUILTIN_ROLLOUT_MODULES = {
    "hf": "verl.workers.rollout.hf_rollout",
    "vllm": "verl.workers.rollout.vllm_rollout",
    "sglang": "verl.workers.rollout.sglang_rollout",
    "trtllm": "verl.workers.rollout.trtllm_rollout",
    "openai": "verl.workers.rollout.openai_rollout",
}


def params_per_prompt(params: SamplingParams | list[SamplingParams], n_prompts: int) -> list[SamplingParams]:
    """An engine's `generate` params as one SamplingParams per prompt (one shared, or a list of exactly n_prompts)."""
    per_prompt = params if isinstance(params, list) else [params] * n_prompts
    if len(per_prompt) != n_prompts:
        raise ValueError(f"{len(per_prompt)} sampling params for {n_prompts} prompts")
    return per_prompt


def register_rollout(name: str):
    """Class decorator: make an engine selectable with `actor_rollout_ref.rollout.name=<name>`."""

    def decorator(cls: type[RolloutEngine]) -> type[RolloutEngine]:
        if _ROLLOUT_REGISTRY.get(name, cls) is not cls:
            raise ValueError(f"rollout engine {name!r} is already registered by {_ROLLOUT_REGISTRY[name].__name__}")
        _ROLLOUT_REGISTRY[name] = cls
        return cls

    return decorator


def get_rollout_cls(name: str) -> type[RolloutEngine]:
    """The engine class registered as `name` (importing the built-in module that defines it if needed)."""
    if name not in _ROLLOUT_REGISTRY and name in _BUILTIN_ROLLOUT_MODULES:
        importlib.import_module(_BUILTIN_ROLLOUT_MODULES[name])
    if name not in _ROLLOUT_REGISTRY:
        known = sorted(set(_ROLLOUT_REGISTRY) | set(_BUILTIN_ROLLOUT_MODULES))
        raise ValueError(f"actor_rollout_ref.rollout.name={name!r} is not a known rollout engine; known: {known}")
    return _ROLLOUT_REGISTRY[name]


def known_rollout_names() -> list[str]:
    """Every selectable `rollout.name`: "auto", the built-in engines and whatever `register_rollout` added."""
    return sorted({"auto", *_BUILTIN_ROLLOUT_MODULES, *ENGINES_NOT_BUILT, *_ROLLOUT_REGISTRY})


def has_verl_tools(rollout: Any) -> bool:
    """Whether verl-style tools are configured (multi_turn.tool_config_path / function_tool_path): only verl's agent
    loops call them."""
    multi_turn = rollout.get("multi_turn") or {}
    return bool(multi_turn.get("tool_config_path") or multi_turn.get("function_tool_path"))


def uses_agent_loop(rollout: Any) -> bool:
    """Whether generation runs the round-based tool loop of agent_loop.py (ARPO/AEPO): rollout.mode=sync_with_tool,
    or multi_turn.enable where verl's agent loops do not run."""
    if uses_async_agent(rollout):
        return False
    return rollout.mode == "sync_with_tool" or bool((rollout.get("multi_turn") or {}).get("enable"))


def uses_async_agent(rollout: Any) -> bool:
    """Whether generation runs verl's per-sample agent loops (async_agent.py): rollout.mode=async, or the default
    mode=sync with verl-style tools, as verl's multi-turn examples leave the mode to verl 0.9's default (async, its
    only mode)."""
    return rollout.mode == "async" or (rollout.mode == "sync" and has_verl_tools(rollout))


def async_agent_beyond_single_turn(rollout: Any) -> bool:
    """mode=async where a loop may do more than sample once: tools configured (verl's tool YAML, function tools,
    rollout.tools), a default loop other than single_turn_agent, or loops listed in agent.agent_loop_config_path.
    Its rows may then hold tokens whose log-probs the engine did not compute in one pass with the row."""
    if not uses_async_agent(rollout):
        return False
    multi_turn, tools, agent = (rollout.get(key) or {} for key in ("multi_turn", "tools", "agent"))
    return bool(multi_turn.get("tool_config_path") or multi_turn.get("function_tool_path")
                or tools.get("tool_instances") or tools.get("config_path") or agent.get("agent_loop_config_path")
                or (agent.get("default_agent_loop") or "single_turn_agent") != "single_turn_agent")


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


# ---- what the served engines (vLLM, SGLang) read from the rollout config the same way


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

# rollout.name=auto on CPU takes vLLM's CPU build, where it is installed, from this many actor parameters on: at the
# Qwen2.5-0.5B shape on 2 cores it decoded a GRPO step's 8 x 64 tokens in 8.1 s against the HF engine's 20.0 (the
# step: 37.3 s against 43.6); a small model decodes faster in the HF engine, vLLM's per-step overhead dominating.
VLLM_CPU_MIN_PARAMETERS = 50_000_000


# Engine names verl accepts whose engines Quiver does not have: unless a plug-in registered one under that name, they
# run on what rollout.name=auto picks (announced at start-up by config_rules.announce_inert_keys). None today.
ENGINES_NOT_BUILT: dict[str, str] = {}


@dataclass(frozen=True)
class CudaOnlyEngine:
    """An engine of one GPU per rank that runs only on CUDA and where its package is installed."""

    label: str  # its name in messages
    package: str  # the module that must be importable
    install: str  # how to install it


# Engines whose state outlives them in their process (vLLM's distributed groups and platform settings, SGLang's and
# TensorRT-LLM's runtimes): a rank that built one runs in a process of its own, never a kept one (host.py's pool).
PROCESS_BOUND_ENGINES = frozenset({"vllm", "sglang", "trtllm"})

# Elsewhere their names resolve as auto (announced the same way), so that a verl script naming them runs anywhere.
CUDA_ONLY_ENGINES = {
    "sglang": CudaOnlyEngine("SGLang", "sglang", "pip install sglang"),
    "trtllm": CudaOnlyEngine("TensorRT-LLM", "tensorrt_llm",
                             "pip install tensorrt_llm --extra-index-url https://pypi.nvidia.com (its PyPI package "
                             "alone is a stub)"),
}


def engine_unavailable(name: str, device: str, tensor_parallel: int = 1) -> str | None:
    """Why the engine `name` cannot run here -- a name of ENGINES_NOT_BUILT no plug-in registered, or a CUDA-only
    engine off CUDA, without its package or asked for tensor parallelism (`rollout.tensor_model_parallel_size`),
    which it lacks --, or None when it can (or is not one of those)."""
    if name in ENGINES_NOT_BUILT and name not in _ROLLOUT_REGISTRY:
        return f"Quiver has no {ENGINES_NOT_BUILT[name]} engine"
    engine = CUDA_ONLY_ENGINES.get(name)
    if engine is not None:
        if device != "cuda":
            return f"the {engine.label} engine runs on CUDA only (device is {device})"
        if importlib.util.find_spec(engine.package) is None:
            return f"{engine.label} is not installed ({engine.install})"
        if tensor_parallel != 1:
            return (f"Quiver's {engine.label} engine runs one single-GPU engine per rank, without the tensor "
                    f"parallelism asked for (tensor_model_parallel_size={tensor_parallel})")
    return None


def cuda_only_engine_refusals(name: str, device: str, tensor_parallel, prefix: str,
                              n_ranks: int | None = None) -> list[str]:
    """Why a CUDA_ONLY_ENGINES engine cannot be built on `device` with `rollout.tensor_model_parallel_size`: it runs
    on CUDA only, and one single-GPU engine per rank, which receives that rank's weights (no tensor parallelism)."""
    label, refusals = CUDA_ONLY_ENGINES[name].label, []
    if device != "cuda":
        refusals.append(f"{prefix}.name={name} runs on CUDA GPUs only (device is {device}); the engines that run on "
                        f"CPU are {prefix}.name=hf and {prefix}.name=vllm (vLLM's CPU build)")
    if tensor_parallel != 1:
        ranks = f" ({n_ranks} here)" if n_ranks else ""
        refusals.append(f"{prefix}.tensor_model_parallel_size={tensor_parallel}: Quiver's {label} engine runs one "
                        f"single-GPU engine on each rank{ranks}, without tensor parallelism; set it to 1, or use "
                        f"{prefix}.name=vllm for tensor-parallel rollout")
    return refusals


def cuda_only_engine_problems(name: str, rollout, device: str, n_ranks: int, prefix: str) -> list[str]:
    """What stops the CUDA_ONLY_ENGINES engine `name`, once chosen, from running this rollout config on `device` and
    `n_ranks` ranks, as messages naming the keys (a name that cannot run here resolves as auto instead: see
    `engine_unavailable`)."""
    engine = CUDA_ONLY_ENGINES[name]
    problems = cuda_only_engine_refusals(name, device, config_value(rollout, "tensor_model_parallel_size"), prefix,
                                         n_ranks)
    if importlib.util.find_spec(engine.package) is None:
        problems.append(f"{prefix}.name={name} needs {engine.label}, on a CUDA machine: {engine.install}")
    if uses_agent_loop(rollout) and rollout.get("entropy_mode") == "exact":
        problems.append(f"{prefix}.entropy_mode=exact needs full-vocabulary entropies, which {engine.label} does not "
                        f"compute; use entropy_mode=topk (ARPO's estimate) or {prefix}.name=hf")
    return problems


def resolve_rollout_name(name: str, device: str, actor_parameters: int | None = None,
                         vllm_problems: Callable[[], list[str]] | None = None, tensor_parallel: int = 1) -> str:
    """`rollout.name=auto`: vLLM where it is installed -- on CUDA, and on CPU for an actor of VLLM_CPU_MIN_PARAMETERS
    or more (`actor_parameters`) that vLLM's CPU build can run (`vllm_problems()` finds nothing) --, otherwise the
    HF engine. A name that `engine_unavailable` rules out here (with `rollout.tensor_model_parallel_size`) resolves
    as auto."""
    if engine_unavailable(name, device, tensor_parallel):
        name = "auto"
    if name != "auto" or importlib.util.find_spec("vllm") is None:
        return "hf" if name == "auto" else name
    if device == "cuda":
        return "vllm"
    large = (actor_parameters or 0) >= VLLM_CPU_MIN_PARAMETERS
    return "vllm" if large and vllm_problems is not None and not vllm_problems() else "hf"


def _unpadded_prompts(prompts: DataProto) -> list[list[int]]:
    """The engine requests: `raw_prompt_ids` when the dataset kept them, else the prompt ids under the mask."""
    if "raw_prompt_ids" in prompts.non_tensor_batch:
        return [list(map(int, ids)) for ids in prompts.non_tensor_batch["raw_prompt_ids"]]
    # On the host: the rows are read one by one (each read of a GPU tensor would be a sync).
    input_ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].bool().cpu()
    return [row[row_mask].tolist() for row, row_mask in zip(input_ids, mask)]


def generate_sequences(
    engine: RolloutEngine,
    prompts: DataProto,
    params: SamplingParams,
    response_length: int,
    pad_token_id: int,
    eos_token_id: int | list[int],
) -> DataProto:
    """Sample responses for a left-padded prompt batch and lay them out as the trainer's rollout batch.

    prompts: batch `input_ids`, `attention_mask`, `position_ids` `(bs, prompt_len)`, left padded; optional
    non-tensor `raw_prompt_ids`. Generation is capped at `response_length` tokens (`params.max_tokens` if smaller).

    Returns `bs * params.n` rows, the n samples of a prompt adjacent, with batch keys
    `prompts` `(bs*n, prompt_len)`, `responses` `(bs*n, response_len)` right padded with `pad_token_id`,
    `input_ids` / `attention_mask` / `position_ids` `(bs*n, prompt_len + response_len)`, `response_mask`
    (1 on generated tokens up to and including EOS), `rollout_log_probs` and `rollout_entropys` (float32, 0 on
    padding); every non-tensor entry of `prompts` repeated n times, plus object arrays `finish_reason` and
    `stop_reason`; `meta_info` copied from `prompts`.
    """
    params = replace(params, max_tokens=min(params.max_tokens, response_length))
    outputs = [out for group in engine.generate(_unpadded_prompts(prompts), params) for out in group]
    if len(outputs) != len(prompts) * params.n:
        raise RuntimeError(
            f"rollout engine returned {len(outputs)} completions for {len(prompts)} prompts x n={params.n}"
        )
    if params.n > 1:
        prompts = prompts.repeat(repeat_times=params.n, interleave=True)

    device = prompts.batch["input_ids"].device

    def pad(rows, value, dtype):
        return pad_2d_list_to_tensor(rows, value, max_length=response_length, dtype=dtype).to(device)

    responses = pad([o.token_ids for o in outputs], pad_token_id, torch.long)
    lengths = torch.tensor([len(o.token_ids) for o in outputs], device=device)
    is_generated = torch.arange(response_length, device=device)[None, :] < lengths[:, None]
    # The EOS cut guards against an engine that returns tokens past EOS.
    mask_dtype = prompts.batch["attention_mask"].dtype
    response_mask = (is_generated & get_response_mask(responses, eos_token_id).bool()).to(mask_dtype)
    return layout_rollout_batch(
        prompts, responses, response_mask, response_mask,
        log_probs=pad([o.log_probs for o in outputs], 0.0, torch.float32) * response_mask,
        entropys=pad([o.entropies for o in outputs], 0.0, torch.float32) * response_mask,
        extra_non_tensors={"finish_reason": [o.finish_reason for o in outputs],
                           "stop_reason": [o.stop_reason for o in outputs]}, pad_token_id=pad_token_id)


def layout_rollout_batch(prompts: DataProto, responses: torch.Tensor, attended: torch.Tensor,
                         response_mask: torch.Tensor, log_probs: torch.Tensor, entropys: torch.Tensor,
                         extra_non_tensors: dict, pad_token_id: int) -> DataProto:
    """The trainer's rollout batch (keys in docs/internal_contracts.md) from prompts repeated to one row per response.

    responses `(bs, response_len)` right padded; attended: 1 on every response token the model sees (the response's
    part of `attention_mask`); response_mask: 1 on the tokens that train (equal to `attended` for plain sampling,
    0 on tool results for the agent loop); log_probs, entropys: the engine's, 0 where nothing was sampled. The
    prompt side's tensors are named in `meta_info[LEFT_PAD]` with their pad values, so that batches whose prompts are
    padded to other widths (another rank's, whose agent loops rendered longer prompts) concatenate.
    """
    from verl.protocol import LEFT_PAD, DataProto

    prompt_ids, prompt_mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    prompt_pos = prompts.batch["position_ids"]
    # Response positions continue from each prompt's last position (also across right padding, which is masked).
    steps = torch.arange(1, responses.shape[1] + 1, device=prompt_ids.device, dtype=prompt_pos.dtype)
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, attended.to(prompt_mask.dtype)], dim=1),
        "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + steps[None, :]], dim=1),
        "response_mask": response_mask.to(prompt_mask.dtype),
        "rollout_log_probs": log_probs,
        "rollout_entropys": entropys,
    }
    non_tensors = {**prompts.non_tensor_batch, **extra_non_tensors}
    left_pad = {"prompts": pad_token_id, "input_ids": pad_token_id, "attention_mask": 0, "position_ids": 0}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors,
                               meta_info={**prompts.meta_info, LEFT_PAD: left_pad})
