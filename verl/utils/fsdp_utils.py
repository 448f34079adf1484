"""FSDP2 wrapping, the optimizer with its schedule, and the clipped optimizer step: shared by RL and SFT."""

from __future__ import annotations

import math

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

# `fsdp_config.dtype`: the compute dtype of mixed precision on CUDA (verl's names and torch's).
COMPUTE_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                  "fp32": "float32", "float32": "float32"}


def reshards_after_forward(device: str, fsdp_config) -> bool:
    """`fsdp_config.reshard_after_forward`; null: on CUDA yes, on CPU no -- there the all-gather over gloo costs more
    than the memory of keeping the gathered weights from the forward to the backward pass (`reshard_all` frees them
    after a forward without backward)."""
    reshard = (fsdp_config or {}).get("reshard_after_forward")
    return device != "cpu" if reshard is None else bool(reshard)


def shard_model(model: torch.nn.Module, mesh, device: str, fsdp_config=None,
                compute_dtype: str | None = None) -> torch.nn.Module:
    """Apply FSDP2: each decoder layer is its own shard group, then the root (embeddings, norm, head). On a 2-D
    `mesh` (`fsdp_mesh` with HSDP) FSDP2 shards along its last dimension and replicates along the first.

    On CUDA, compute runs in `compute_dtype` (the run plan's; None: `fsdp_config.dtype`, bf16 when the config has
    none) with fp32 gradient reduction, and `param_offload`/`offload_policy` keep the parameters in host memory
    between uses. On CPU everything stays fp32, and a mesh of one rank leaves the model as it is: there is nothing
    to shard or reduce, and FSDP2 would still copy every weight into its gather buffer in the forward and every
    gradient through its reduce buffer in the backward (benchmarks/update_levers.py; the figures: benchmarks/README.md,
    "Measurements behind code choices"). Whatever reads the model's tensors
    takes plain tensors as well as DTensors (the weight push, checkpoints, the merger).
    """
    if device == "cpu" and mesh.size() == 1:
        return model
    fsdp_config = fsdp_config or {}
    kwargs = {"mesh": mesh, "reshard_after_forward": reshards_after_forward(device, fsdp_config)}
    if device == "cuda":
        compute = getattr(torch, compute_dtype or COMPUTE_DTYPES[str(fsdp_config.get("dtype") or "bfloat16")])
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        if fsdp_config.get("param_offload") or fsdp_config.get("offload_policy"):
            kwargs["offload_policy"] = CPUOffloadPolicy()
    # A peft model wraps the HF model: its decoder layers are those of the base model.
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(hf_model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers; FSDP2 wrapping expects a decoder-only HF "
                         "model such as Qwen2 or Llama")
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if device == "cpu":
        # FSDP averages the ranks' gradients with a ReduceOp.AVG reduce-scatter, which gloo sums in torch 2.8: make it
        # sum and divide by the number of ranks itself, the mean on every torch.
        for module in (*layers, model):
            module.set_force_sum_reduction_for_comms(True)
    return model


def fsdp_mesh(device: str, world_size: int, shard_size: int):
    """The device mesh FSDP2 shards a model over: one dimension of every rank, or with `shard_size` < world_size
    (fsdp_config.fsdp_size, HSDP) two: ("replicate", "shard") = (world_size / shard_size, shard_size). Rank r is in
    shard group r // shard_size, so ranks 0 .. shard_size - 1 together hold one whole copy of the model."""
    from torch.distributed.device_mesh import init_device_mesh

    if shard_size >= world_size:
        return init_device_mesh(device, (world_size,), mesh_dim_names=("fsdp",))
    return init_device_mesh(device, (world_size // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))


def reshard_all(model: torch.nn.Module) -> None:
    """Free the gathered weights that a forward pass without backward left behind (reshard_after_forward=false)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


# Before torch 2.13, fused AdamW over DTensor parameters keeps one DTensorSpec per parameter per step alive
# (pytorch/pytorch#188174): on an H100 with torch 2.11, 540 of them after 20 steps over 27 parameters, so a run's
# host memory would grow without bound. torch 2.13 keeps none, on CUDA or on the CPU.
FUSED_ADAMW_MIN_TORCH = (2, 13)


def adamw_is_fused(device_type: str) -> bool:
    """Whether `build_optimizer` steps parameters on `device_type` with torch's fused AdamW (the memory estimate
    reads it too: the fused step makes no full-size temporaries, the foreach one a denominator per moment)."""
    return device_type in ("cuda", "cpu") and torch.__version__ >= FUSED_ADAMW_MIN_TORCH


def build_optimizer(model: torch.nn.Module, lr: float, betas, weight_decay: float, total_steps: int,
                    warmup_steps: int = 0, scheduler: str = "constant", num_cycles: float = 0.5,
                    min_lr_ratio: float = 0.0):
    """AdamW plus a linear warmup followed by a constant or cosine learning rate (transformers' schedules).

    With every trainable parameter on one CUDA or CPU device (FSDP2's DTensor shards included, also when offloaded
    to host memory) and torch at FUSED_ADAMW_MIN_TORCH or newer, AdamW is torch's fused kernel: one pass over each
    parameter's weight, gradient and moments instead of a dozen (benchmarks/update_levers.py; the figures:
    benchmarks/README.md, "Measurements behind code choices"; transformers' Trainer, TRL's too, defaults to it as
    well);
    elsewhere torch picks. tests/gpu/test_gpu_optimizer.py checks, on the torch it runs on, that the optimizer built
    here keeps no host objects between steps.
    """
    from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    devices = {p.device.type for p in trainable}
    fused = len(devices) == 1 and adamw_is_fused(next(iter(devices)))
    # Parameters held in a lower precision (fsdp_config.model_dtype) step through float32 master copies.
    adamw = Float32MasterAdamW if any(p.dtype != torch.float32 for p in trainable) else torch.optim.AdamW
    optimizer = adamw(trainable, lr=lr, betas=tuple(betas), weight_decay=weight_decay, fused=True if fused else None)
    if scheduler == "cosine":
        lr_scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, num_warmup_steps=warmup_steps, num_training_steps=max(1, total_steps), num_cycles=num_cycles,
            min_lr_rate=min_lr_ratio)
    elif scheduler == "constant":
        lr_scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup_steps)
    else:
        raise ValueError(f"unknown lr scheduler {scheduler!r}; expected constant or cosine")
    return optimizer, lr_scheduler


class Float32MasterAdamW(torch.optim.AdamW):
    """AdamW for parameters held in bf16 or fp16 (`fsdp_config.model_dtype`): the optimizer steps float32 master
    copies of them (its `param_groups` hold the masters, so lr schedules and checkpoints see those), and after each
    step the parameters receive the masters' values rounded to their dtype.

    Why masters: an Adam update is about lr per step, and a bf16 weight of magnitude w moves only in steps of about
    w / 128; at RL's learning rates (1e-6) updating the bf16 weights directly would round nearly every update away.
    What it costs: between updates 2 + 4 + 8 bytes per parameter (weight, master, moments) against float32's 4 + 8,
    and in the step each gradient becomes a float32 one (the bf16 one is freed as it is converted). So a bf16 actor
    saves no memory (benchmarks/memory_levers.py measured its peak 0.8 GiB above float32's at the 0.5B shape); it is
    here so that verl scripts that set it train correctly. The reference model in bf16 (no optimizer) is the lever.
    The masters are sharded like their parameters (FSDP2 DTensors) and saved in the optimizer state as `master`, so
    a resume continues from the float32 values.
    """

    def __init__(self, params, **kwargs):
        self.model_params = list(params)
        masters = [torch.nn.Parameter(p.detach().float(), requires_grad=True) for p in self.model_params]
        super().__init__(masters, **kwargs)

    def _masters(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        masters = self._masters()
        for param, master in zip(self.model_params, masters, strict=True):
            master.grad = None if param.grad is None else param.grad.float()
            param.grad = None  # one gradient copy at a time
        loss = super().step(closure)
        for param, master in zip(self.model_params, masters, strict=True):
            param.copy_(master)
            master.grad = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for param in self.model_params:
            param.grad = None

    def state_dict(self) -> dict:
        state = super().state_dict()
        for index, master in enumerate(self._masters()):  # a new dict: the packed ones are the live state's
            state["state"][index] = {**state["state"].get(index, {}), "master": master.detach()}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = {**state_dict, "state": {index: dict(entry) for index, entry in state_dict["state"].items()}}
        masters = self._masters()
        with torch.no_grad():
            for index, entry in list(state_dict["state"].items()):
                saved = entry.pop("master", None)
                if saved is not None:
                    masters[int(index)].copy_(saved)
                if not entry:
                    del state_dict["state"][index]
        super().load_state_dict(state_dict)


def compile_layers(model: torch.nn.Module) -> None:
    """`use_torch_compile`: each decoder layer's forward through torch.compile (inductor), in place. A layer is
    compiled once and its shapes become dynamic after the first new sequence length, so micro-batches of other
    lengths reuse it; FSDP2's hooks stay outside the compiled region (they wrap the layer module)."""
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    for layer in hf_model.model.layers:
        layer.compile()


def clip_grad_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float,
                       who: str = "actor") -> float:
    """Clip the gradient norm, step, zero the gradients; the step is skipped (and said) when the norm is not finite.

    Returns the norm before clipping.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
    if isinstance(grad_norm, DTensor):
        grad_norm = grad_norm.full_tensor()
    grad_norm = float(grad_norm)
    if math.isfinite(grad_norm):
        optimizer.step()
    else:
        print(f"[{who}] gradient norm is {grad_norm}: skipping this optimizer step")
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def params_in_host_memory(device: str, fsdp_config) -> bool:
    """`fsdp_config.param_offload` / `offload_policy` on CUDA: FSDP2's CPUOffloadPolicy keeps the sharded parameters,
    their gradients, and so the optimizer's state and step, in host memory (each layer's weights visit the GPU only
    while it computes)."""
    fsdp_config = fsdp_config or {}
    return device == "cuda" and bool(fsdp_config.get("param_offload") or fsdp_config.get("offload_policy"))


def offloads_optimizer_state(device: str, fsdp_config) -> bool:
    """`fsdp_config.optimizer_offload` on CUDA for parameters on the GPU: the optimizer's state waits in host memory
    between updates and comes to the GPU for each (`move_optimizer_state`). With the parameters in host memory
    (`params_in_host_memory`) the state is there already and stays: the optimizer steps there."""
    fsdp_config = fsdp_config or {}
    return device == "cuda" and bool(fsdp_config.get("optimizer_offload")) and not params_in_host_memory(device,
                                                                                                        fsdp_config)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: str | torch.device) -> None:
    """Move the optimizer's state to `device`, in place: Adam's moments and Float32MasterAdamW's float32 masters
    (`fsdp_config.optimizer_offload` keeps them in host memory between updates on CUDA). Scalar tensors (Adam's
    step counts) stay where AdamW made them: the foreach step reads them on the host (on the GPU each read would be
    a sync per parameter), the fused step on the parameters' device."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                state[key] = value.to(device, non_blocking=True)
    if isinstance(optimizer, Float32MasterAdamW):
        # Swapped, not `master.data = ...`: for FSDP2's DTensor masters that assignment changes only the wrapper's
        # device and leaves the shard's storage where it was. The swap keeps each master the same Python object
        # (param_groups and the state's keys).
        for master in optimizer._masters():
            moved = torch.nn.Parameter(master.detach().to(device, non_blocking=True), requires_grad=True)
            torch.utils.swap_tensors(master, moved)


STEP_SETTINGS = ("fused", "foreach", "capturable")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """`optimizer.load_state_dict`, but how this process steps stays what `build_optimizer` chose here: torch's
    load restores each group's fused / foreach / capturable flags as saved, so a checkpoint written with another torch
    or on another device would otherwise step with that process's kernel choice (fused AdamW over DTensors where
    FUSED_ADAMW_MIN_TORCH rules it out, or the slow single-tensor loop where the fused kernel is available)."""
    chosen = [{key: group[key] for key in STEP_SETTINGS if key in group} for group in optimizer.param_groups]
    optimizer.load_state_dict(state_dict)
    for group, settings in zip(optimizer.param_groups, chosen, strict=True):
        group.update(settings)


def count_skipped_steps(grad_norms: list[float], in_row: int) -> tuple[int, int]:
    """(how many of an update's optimizer steps were skipped, the run of skipped steps ending at its last one).

    `grad_norms` are the update's norms in order; `clip_grad_and_step` skips a step whose norm is not finite. A run
    reaching back to the start of the update continues `in_row`, the run the previous update ended with.
    """
    skipped = 0
    for norm in grad_norms:
        finite = math.isfinite(norm)
        skipped += not finite
        in_row = 0 if finite else in_row + 1
    return skipped, in_row
