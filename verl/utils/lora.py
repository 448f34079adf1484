r"""LoRA through `peft` (`actor_rollout_ref.model.lora_rank > 0`, or `lora_adapter_path`: start from a saved adapter):
adapters on the actor, merged weights elsewhere.

Only the adapter weights train. The reference policy is the same module with the adapter switched off (no second
copy of the model). The rollout engine and the merged HF model get plain weights of the base architecture:

    W = W_base + (lora_alpha / r) * B @ A          for every adapted linear layer

(`merge_lora_items`, a stream so that FSDP shards are gathered one tensor at a time). Checkpoints hold the whole
state (base and adapter) for resuming; the model merger writes the merged model and, on request, the adapter alone
in peft's format.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

PEFT_PREFIX = "base_model.model."
_LORA_PART = re.compile(r"^(?P<module>.+)\.(?P<part>base_layer\.weight|base_layer\.bias|lora_A\.default\.weight|"
                        r"lora_B\.default\.weight)$")


ADAPTER_CONFIG = "adapter_config.json"


def read_adapter_config(path: str) -> dict | None:
    """The adapter_config.json of the saved peft adapter in folder `path`, or None when there is none."""
    import json
    import os

    config_file = os.path.join(os.path.expanduser(path), ADAPTER_CONFIG)
    if not os.path.isfile(config_file):
        return None
    with open(config_file) as f:
        return json.load(f)


def lora_settings(model_cfg) -> tuple[int, float, object] | None:
    """(rank, alpha, target modules) of the actor's LoRA, or None for full fine-tuning: `lora_rank` > 0, or a saved
    adapter at `lora_adapter_path` (verl's key), whose own r, lora_alpha and target_modules then hold. The one place
    that decides whether a run trains LoRA adapters."""
    path = model_cfg.get("lora_adapter_path")
    if path:
        saved = read_adapter_config(path)
        if saved is None:
            raise FileNotFoundError(f"actor_rollout_ref.model.lora_adapter_path={path}: no {ADAPTER_CONFIG} there")
        return int(saved["r"]), float(saved["lora_alpha"]), saved["target_modules"]
    if model_cfg.lora_rank > 0:
        return model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.target_modules
    return None


def load_lora_adapter(model: torch.nn.Module, path: str):
    """The peft model with the saved adapter at `path` loaded as the trainable "default" adapter."""
    import os

    from peft import PeftModel

    return PeftModel.from_pretrained(model, os.path.expanduser(path), is_trainable=True)


def apply_lora(model: torch.nn.Module, rank: int, alpha: float, target_modules, exclude_modules: str | None = None):
    """The peft model with LoRA adapters of rank `rank` on `target_modules` ("all-linear", a list of module names,
    or a comma-separated string); everything else frozen."""
    from peft import LoraConfig, get_peft_model

    if isinstance(target_modules, str) and target_modules != "all-linear":
        target_modules = [name.strip() for name in target_modules.split(",") if name.strip()]
    else:
        target_modules = list(target_modules) if not isinstance(target_modules, str) else target_modules
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, exclude_modules=exclude_modules,
                        task_type="CAUSAL_LM", bias="none")
    return get_peft_model(model, config)


def is_peft_model(module: torch.nn.Module) -> bool:
    return hasattr(module, "peft_config") and hasattr(module, "disable_adapter")


def lora_scaling(module: torch.nn.Module) -> float:
    config = module.peft_config["default"]
    return config.lora_alpha / config.r


def merge_lora_items(items: Iterable[tuple[str, torch.Tensor]], scaling: float) -> Iterator[tuple[str, torch.Tensor]]:
    """(peft state name, full tensor) -> (HF name, tensor) with every adapter folded into its base weight."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in items:
        name = name.removeprefix(PEFT_PREFIX)
        match = _LORA_PART.match(name)
        if match is None:
            yield name, tensor
            continue
        module, part = match.group("module"), match.group("part")
        if part == "base_layer.bias":
            yield f"{module}.bias", tensor
            continue
        parts = pending.setdefault(module, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[module]
            base, a, b = parts["base_layer.weight"], parts["lora_A.default.weight"], parts["lora_B.default.weight"]
            yield f"{module}.weight", base + scaling * (b.to(base.dtype) @ a.to(base.dtype))
    if pending:
        raise ValueError(f"LoRA layers without all of base weight, lora_A and lora_B: {sorted(pending)}")


def adapter_items(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter weights alone, named as peft saves them (adapter_model.safetensors)."""
    return {name.replace(".default.weight", ".weight"): tensor for name, tensor in state.items()
            if ".lora_A." in name or ".lora_B." in name}
