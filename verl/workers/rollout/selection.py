"""Which engine a rollout config runs: `rollout.name=auto` resolved by device, installed packages and actor size
(`resolve_rollout_name`), and what stops an engine that runs only on CUDA (SGLang, TensorRT-LLM) from running here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from verl.workers.rollout.modes import uses_agent_loop
from verl.workers.rollout.registry import ENGINES_NOT_BUILT, is_registered
from verl.workers.rollout.served import config_value

# rollout.name=auto on CPU takes vLLM's CPU build, where it is installed, from this many actor parameters on: a large
# model decodes faster in vLLM, a small one in the HF engine, vLLM's per-step overhead dominating (the figures:
# benchmarks/README.md, "Measurements behind code choices").
VLLM_CPU_MIN_PARAMETERS = 50_000_000


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
    if name in ENGINES_NOT_BUILT and not is_registered(name):
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
