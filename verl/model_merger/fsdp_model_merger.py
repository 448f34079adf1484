"""Merge an FSDP actor or critic checkpoint into one HuggingFace model directory, on CPU and without
torch.distributed.

Each `model_world_size_W_rank_r.pt` holds rank r's local shard of every tensor (the layout is in
docs/internal_contracts.md). A sharded tensor is the concatenation of the ranks' shards along its shard dim, in rank
order; a replicated tensor is rank 0's copy (`merge_shards` of verl/utils/checkpoint, which re-sharding on resume
shares). The shards are first checked against the step's manifest.json. The merged state dict is loaded into a model built from
`huggingface/config.json` and saved with `save_pretrained`, next to the tokenizer and generation config. An actor
becomes an AutoModelForCausalLM, a critic (a value head on the same body) an AutoModelForTokenClassification.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import warnings

import torch
from tqdm import tqdm

from verl.utils.checkpoint.checkpoint_manager import (
    LATEST_FILE,
    MANIFEST_FILE,
    STEP_DIR,
    TMP_PREFIX,
    CheckpointError,
    checkpoint_problems,
    damage_report,
)
from verl.utils.checkpoint.fsdp_checkpoint_manager import load_file, merge_shards
from verl.utils.checkpoint.fsdp_checkpoint_manager import shard_file_name as rank_file_name
from verl.utils.lora import PEFT_PREFIX, adapter_items, merge_lora_items

SHARD_FILE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def shard_file_name(world_size: int, rank: int) -> str:
    return rank_file_name("model", world_size, rank)


def _not_an_actor_dir(local_dir: str) -> CheckpointError:
    """Explain a --local_dir without shards, guessing the right directory when the user pointed one level too high."""
    if not os.path.isdir(local_dir):
        return CheckpointError(f"--local_dir {local_dir} does not exist")
    entries = os.listdir(local_dir)
    if os.path.isdir(os.path.join(local_dir, "actor")):
        return CheckpointError(
            f"{local_dir} is a global_step_N directory, not an actor checkpoint; "
            f"use --local_dir {os.path.join(local_dir, 'actor')}"
        )
    steps = sorted(int(m.group(1)) for name in entries if (m := STEP_DIR.match(name)))
    if steps or LATEST_FILE in entries:
        latest = steps[-1] if steps else "N"
        if LATEST_FILE in entries:
            with open(os.path.join(local_dir, LATEST_FILE)) as f:
                latest = f.read().strip()
        return CheckpointError(
            f"{local_dir} is a run directory (trainer.default_local_dir), not an actor checkpoint; "
            f"use --local_dir {os.path.join(local_dir, f'global_step_{latest}', 'actor')}"
        )
    return CheckpointError(
        f"no model_world_size_*_rank_*.pt files and no fsdp_config.json in {local_dir}; "
        "--local_dir must be <default_local_dir>/global_step_N/actor (or .../critic)"
    )


def find_world_size(local_dir: str) -> int:
    """world_size from fsdp_config.json, or (older checkpoints without it) from the shard file names."""
    config_path = os.path.join(local_dir, "fsdp_config.json")
    if os.path.exists(config_path):
        with open(config_path) as f:
            return int(json.load(f)["world_size"])
    if not os.path.isdir(local_dir):
        raise _not_an_actor_dir(local_dir)
    sizes = {int(m.group(1)) for name in os.listdir(local_dir) if (m := SHARD_FILE.match(name))}
    if not sizes:
        raise _not_an_actor_dir(local_dir)
    if len(sizes) > 1:
        raise CheckpointError(
            f"{local_dir} mixes shard files of world sizes {sorted(sizes)}; keep only one run's files there"
        )
    (world_size,) = sizes
    warnings.warn(f"{config_path} not found; inferred world_size={world_size} from the shard file names", stacklevel=2)
    return world_size


def verify_checkpoint(local_dir: str) -> None:
    """Check `local_dir` (global_step_N/actor or /critic) against its step's manifest.json; a CheckpointError naming
    every damaged file. Without a manifest (saved before Quiver wrote them) it warns that the merge is unverified."""
    local_dir = os.path.abspath(local_dir)
    step_dir, role = os.path.dirname(local_dir), os.path.basename(local_dir)
    if os.path.basename(step_dir).startswith(TMP_PREFIX):
        return  # merged while it is being saved (save_contents hf_model): the manifest comes last
    problems, verified = checkpoint_problems(step_dir, under=role)
    if problems:
        raise CheckpointError(
            f"the checkpoint is damaged, refusing to merge it: {damage_report(step_dir, problems)}. "
            "Merge an earlier global_step_N instead"
        )
    if not verified:
        warnings.warn(
            f"{os.path.join(step_dir, MANIFEST_FILE)} not found (a checkpoint saved before Quiver wrote "
            "manifests, or an actor directory copied on its own): merging unverified shards",
            stacklevel=2,
        )


def load_shards(local_dir: str, world_size: int) -> list[dict]:
    """Every rank's shard file, in rank order, loaded on CPU."""
    paths = [os.path.join(local_dir, shard_file_name(world_size, rank)) for rank in range(world_size)]
    missing = [os.path.basename(p) for p in paths if not os.path.exists(p)]
    if missing:
        raise CheckpointError(f"world_size={world_size} but {local_dir} lacks {', '.join(missing)}")
    shards = []
    for path in tqdm(paths, desc="Loading shards", unit="rank"):
        try:
            shard = load_file(path, weights_only=True)
        except pickle.UnpicklingError as e:
            raise CheckpointError(
                f"{path} is not a plain-tensor shard file (format quiver-local-shards-v1); "
                f"checkpoints saved by verl itself hold DTensors: merge those with verl ({e})"
            ) from e
        if not isinstance(shard, dict) or "tensors" not in shard:
            raise CheckpointError(f"{path} has no 'tensors' entry; expected the quiver-local-shards-v1 layout")
        shards.append(shard)
    return shards


def auto_model_class(config):
    """The transformers Auto class of a saved config: AutoModelForTokenClassification for a critic's value model
    (architectures *ForTokenClassification), AutoModelForCausalLM otherwise."""
    import transformers

    architectures = getattr(config, "architectures", None) or []
    if any(name.endswith("ForTokenClassification") for name in architectures):
        return transformers.AutoModelForTokenClassification
    return transformers.AutoModelForCausalLM


def build_hf_model(hf_dir: str, state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.nn.Module:
    """A model from `hf_dir`'s config holding exactly `state_dict` (tied weights may appear once or twice)."""
    from transformers import AutoConfig

    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.exists(config_path):
        raise CheckpointError(
            f"{config_path} not found; the merger needs the HF config that the trainer saves in "
            "<actor or critic>/huggingface/"
        )
    config = AutoConfig.from_pretrained(hf_dir)
    config.dtype = dtype
    with torch.device("meta"):  # no memory for the random init; every tensor is replaced below
        model = auto_model_class(config).from_config(config, dtype=dtype)
    result = model.load_state_dict({k: v.to(dtype) for k, v in state_dict.items()}, strict=False, assign=True)
    model.tie_weights()  # re-tie (e.g. lm_head to embed_tokens) after assign=True replaced the parameters
    missing = [name for name, t in model.state_dict().items() if t.is_meta]
    if missing or result.unexpected_keys:
        raise CheckpointError(
            f"the checkpoint does not match {config_path} ({config.architectures}): "
            f"missing keys {missing}, unexpected keys {result.unexpected_keys}"
        )
    return model


def fold_lora(local_dir: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LoRA actor's state (peft names) as the base architecture's, every adapter folded into its weight."""
    config_path = os.path.join(local_dir, "lora_adapter", "adapter_config.json")
    if not os.path.exists(config_path):
        raise CheckpointError(f"the shards hold LoRA adapters but {config_path} (their rank and alpha) is missing")
    with open(config_path) as f:
        config = json.load(f)
    return dict(merge_lora_items(state.items(), config["lora_alpha"] / config["r"]))


def merged_state(local_dir: str) -> tuple[dict[str, torch.Tensor], torch.dtype]:
    """The full state dict of the checkpoint in `local_dir` (as saved: LoRA adapters not folded) and its dtype."""
    world_size = find_world_size(local_dir)
    verify_checkpoint(local_dir)
    shards = load_shards(local_dir, world_size)
    return merge_shards(shards), getattr(torch, shards[0].get("dtype", "float32"))


def merged_model(local_dir: str, dtype: str | None = None, state=None) -> torch.nn.Module:
    """Load, merge and check the shards in `local_dir`; `dtype` None keeps the shards' dtype."""
    state, saved_dtype = state or merged_state(local_dir)
    if any(name.startswith(PEFT_PREFIX) for name in state):
        state = fold_lora(local_dir, state)
    return build_hf_model(os.path.join(local_dir, "huggingface"), state, DTYPES[dtype] if dtype else saved_dtype)


def save_lora_adapter(local_dir: str, state: dict[str, torch.Tensor], target_dir: str) -> str:
    """The adapter alone in peft's format (adapter_model.safetensors + adapter_config.json) under target_dir."""
    from safetensors.torch import save_file

    adapter = adapter_items(state)
    if not adapter:
        raise CheckpointError(f"--save_lora_adapter: the checkpoint in {local_dir} has no LoRA adapter")
    os.makedirs(target_dir, exist_ok=True)
    save_file({k: v.contiguous() for k, v in adapter.items()}, os.path.join(target_dir, "adapter_model.safetensors"))
    shutil.copy2(os.path.join(local_dir, "lora_adapter", "adapter_config.json"), target_dir)
    return target_dir


def merge_checkpoint(local_dir: str, target_dir: str, dtype: str | None = None, lora_adapter: bool = False) -> str:
    """Write the merged model as safetensors plus the tokenizer and generation config to `target_dir` (and with
    `lora_adapter`, a LoRA run's adapter alone to `target_dir/lora_adapter`)."""
    state = merged_state(local_dir)
    if lora_adapter:
        save_lora_adapter(local_dir, state[0], os.path.join(target_dir, "lora_adapter"))
    model = merged_model(local_dir, dtype, state)
    model.save_pretrained(target_dir, safe_serialization=True)
    hf_dir = os.path.join(local_dir, "huggingface")
    if os.path.abspath(target_dir) == os.path.abspath(hf_dir):
        return target_dir  # merged in place (save_contents hf_model): the tokenizer files are there already
    for name in sorted(os.listdir(hf_dir)):
        # config.json was just written with the merged dtype; weights saved with the config are not the trained ones
        if name != "config.json" and not name.endswith(WEIGHT_SUFFIXES) and os.path.isfile(os.path.join(hf_dir, name)):
            shutil.copy2(os.path.join(hf_dir, name), os.path.join(target_dir, name))
    return target_dir


def compare_with_hf(local_dir: str, test_hf_dir: str, atol: float = 1e-6) -> tuple[bool, list[str]]:
    """(match, report lines): max abs difference per tensor between the merged checkpoint and an HF model."""
    from transformers import AutoConfig

    merged = merged_model(local_dir).state_dict()
    reference_class = auto_model_class(AutoConfig.from_pretrained(test_hf_dir))
    reference = reference_class.from_pretrained(test_hf_dir, dtype="auto").state_dict()
    lines, ok = [], True
    for name in sorted(set(merged) | set(reference)):
        if name not in merged or name not in reference:
            ok = False
            lines.append(f"{name}: only in the {'merged checkpoint' if name in merged else 'reference'}")
        elif merged[name].shape != reference[name].shape:
            ok = False
            lines.append(f"{name}: shape {list(merged[name].shape)} != reference {list(reference[name].shape)}")
        else:
            diff = (merged[name].float() - reference[name].float()).abs().max().item() if merged[name].numel() else 0.0
            ok &= diff <= atol
            lines.append(f"{name}: max abs diff {diff:.3g}{'' if diff <= atol else f' > atol {atol:g}  MISMATCH'}")
    return ok, lines
