"""verl 0.9.1 keys Quiver's tree lacks (verl_0_9_keys.tsv) that would change what a run computes.

Such a key is accepted and announced as doing nothing only at a value where ignoring it leaves the run computing
what the user asked for (a profiler, a kernel or memory switch, a seed of a knob Quiver does not have). At any
other value it asks for a computation Quiver does not build: `refuse_verl_values` makes that a ConfigError before
any worker starts, one line per key naming the capability that is missing (REFUSED_VALUES).

verl 0.9's `actor_rollout_ref.model.lora.*` section (Megatron-Bridge's PEFT settings in verl) is read as the actor's
LoRA (`apply_verl_lora_section`): rank, alpha, adapter_path, target_modules and exclude_modules set Quiver's
`lora_rank`, `lora_alpha`, `lora_adapter_path`, `target_modules`, `exclude_modules`. verl's default target modules
there are Megatron's names of the decoder's linear layers (`linear_qkv`, `linear_proj`, `linear_fc1`, `linear_fc2`):
on a Hugging Face model an FSDP user means the same layers, so each Megatron name becomes its Hugging Face names
(`q_proj,k_proj,v_proj`, `o_proj`, `gate_proj,up_proj`, `down_proj`) and all four together become `all-linear`
(peft's every linear layer but the output head: the same set). Other names are module names already.
"""

from __future__ import annotations

import re
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from verl.utils.config import ConfigError, base_config, verl_only_keys

_MISSING = object()

_QAT = "quantization-aware training (fake-quantized weights in the forward pass) is not built"
_OPTIMIZER = "the optimizer is torch's AdamW (optim.lr, betas, weight_decay and the lr schedule keys)"
_MTP = "multi-token prediction (MTP) layers and their loss are not built"
_TEMPLATE = ("a chat template given in the config is not applied: prompts are rendered by the tokenizer's own "
             "template (put yours in the tokenizer_config.json of model.path or model.tokenizer_path)")
_HF_CONFIG = "the model's config is read from model.path (no separate hf_config_path)"
_REWARD_CLASS = ("a reward manager or reward loop loaded from a module path is not built: register yours with "
                 "@register(name) in a module named in trainer.plugins and set reward_model.reward_manager=name")
_SKIP = ("replaying dumped rollouts runs in the synchronous trainer only (skip.rollout; trainer.v1.trainer_mode="
         "sync); Quiver has no transfer queue and its async modes generate every step")

# key -> (the values Quiver computes the same for, what Quiver lacks). null always passes: verl's defaults here
# are null or interpolations of a Quiver key where null is what they mean.
REFUSED_VALUES: dict[str, tuple[tuple, str]] = {
    **{f"{section}.qat.enable": ((False,), _QAT)
       for section in ("actor_rollout_ref.actor", "actor_rollout_ref.actor.fsdp_config",
                       "actor_rollout_ref.ref.fsdp_config", "critic.fsdp")},
    **{f"{role}.optim.{key}": (values, _OPTIMIZER)
       for role in ("actor_rollout_ref.actor", "critic")
       for key, values in (("optimizer", ("AdamW", "adamw")), ("optimizer_impl", ("torch.optim",)),
                           ("override_optimizer_config", ({},)))},
    **{f"{model}.mtp.{key}": ((False,), _MTP)
       for model in ("actor_rollout_ref.model", "critic.model") for key in ("enable", "enable_train")},
    "actor_rollout_ref.model.custom_chat_template": ((), _TEMPLATE),
    "critic.model.custom_chat_template": ((), _TEMPLATE),
    "actor_rollout_ref.model.hf_config_path": ((), _HF_CONFIG),
    "critic.model.hf_config_path": ((), _HF_CONFIG),
    "critic.model.lora.rank": ((0,), "the critic is always a full FSDP2 model (no LoRA critic)"),
    "critic.loss_scale_factor": ((), "the critic's value loss is not rescaled by a loss_scale_factor"),
    "actor_rollout_ref.rollout.logprobs_mode": (
        ("processed_logprobs",), "the engines return processed log-probs (of the sampling distribution after "
                                 "temperature, top-k and top-p), not raw ones"),
    "actor_rollout_ref.rollout.quantization": (
        (), "the rollout engine samples with the actor's weights unquantized (no fp8 or int rollout)"),
    "actor_rollout_ref.rollout.quantization_config_file": (
        (), "the rollout engine samples with the actor's weights unquantized (no fp8 or int rollout)"),
    "data.tokenizer": ((), "prompts are tokenized by model.path's tokenizer (or model.tokenizer_path)"),
    "reward.reward_manager.source": (("register",), _REWARD_CLASS),
    "reward.reward_manager.module.path": ((), _REWARD_CLASS),
    "reward_model.reward_loop_source": (("register",), _REWARD_CLASS),
    "reward_model.reward_loop_module_path": ((), _REWARD_CLASS),
    "reward_model.reward_loop_class_name": ((), _REWARD_CLASS),
    "actor_rollout_ref.actor.fsdp_config.router_replay.mode": (
        ("disabled",), "MoE routing replay (the rollout's expert choices replayed in the actor's forward, R2/R3) is "
                       "not built: the actor's router picks its own experts"),
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": (
        (False,), "MoE routing replay (the rollout's expert choices replayed in the actor's forward) is not built"),
    "skip.async_rollout.enable": ((False,), _SKIP),
    "skip.rollout_tq.enable": ((False,), _SKIP),
    # verl 0.9's newer LoRA section: what Quiver's LoRA does not do (the rest maps, see apply_verl_lora_section).
    # canonical LoRA is Megatron's LoRA with an adapter per q, k, v (and gate, up) instead of one per fused layer:
    # on a Hugging Face model, whose q, k, v are separate layers, that is peft's LoRA.
    "actor_rollout_ref.model.lora.type": (("lora", "canonical_lora"), "LoRA is peft's plain LoRA (no DoRA)"),
    "actor_rollout_ref.model.lora.dropout": ((0, 0.0), "LoRA trains without adapter dropout"),
    "actor_rollout_ref.model.lora.lora_B_init_method": (
        ("zero",), "LoRA's B starts at zero (the first step's model is the base model)"),
    "actor_rollout_ref.model.lora.freeze_language_model": (
        (True,), "with LoRA only the adapters train (the base model stays frozen)"),
}


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _set(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, default=_MISSING, throw_on_resolution_failure=False)


def refuse_verl_values(cfg: DictConfig) -> None:
    """ConfigError listing each REFUSED_VALUES key that `cfg` sets to a value Quiver does not compute."""
    problems = []
    for key, (same, missing) in REFUSED_VALUES.items():
        value = _plain(_set(cfg, key))
        if value is _MISSING or value is None or value in same:
            continue
        problems.append(f"{key}={value!r}: {missing}; Quiver cannot run it (verl's default: "
                        f"{verl_only_keys().get(key, 'null')})")
    if problems:
        raise ConfigError("verl keys at values that ask for what Quiver does not build:\n  - "
                          + "\n  - ".join(problems))


# verl 0.9's LoRA section -> Quiver's key.
LORA_SECTION = "actor_rollout_ref.model.lora"
LORA_KEYS = {"rank": "lora_rank", "alpha": "lora_alpha", "adapter_path": "lora_adapter_path",
             "target_modules": "target_modules", "exclude_modules": "exclude_modules"}
# Megatron's names of a decoder layer's linear layers -> the Hugging Face names of the same layers.
MEGATRON_LINEARS = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                    "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}
# canonical LoRA's split names of the same layers (verl's lora.type=canonical_lora scripts list them).
SPLIT_LINEARS = {"linear_q": ("q_proj",), "linear_k": ("k_proj",), "linear_v": ("v_proj",),
                 "linear_fc1_gate": ("gate_proj",), "linear_fc1_up": ("up_proj",)}


def hf_target_modules(names) -> str:
    """Quiver's target_modules for verl's lora.target_modules `names` (a list or a comma-separated string)."""
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    if set(names) >= set(MEGATRON_LINEARS) or "all-linear" in names:
        return "all-linear"
    hf_names = {**MEGATRON_LINEARS, **SPLIT_LINEARS}
    return ",".join(hf for name in names for hf in hf_names.get(name, (name,)))


def exclude_regex(names) -> str | None:
    """Quiver's exclude_modules (a regex peft matches against the whole module name) for verl's list of names:
    a module whose last name is one of them, as peft matches a list."""
    if isinstance(names, str):
        return names or None
    names = list(names)
    return f"(.*\\.)?({'|'.join(re.escape(name) for name in names)})" if names else None


def apply_verl_lora_section(cfg: DictConfig) -> None:
    """Move `actor_rollout_ref.model.lora.*` onto Quiver's LoRA keys of `actor_rollout_ref.model`, in place; the
    section leaves the config. A key set in both spellings to different values is a ConfigError. With the section
    turning LoRA on (rank > 0) and no lora.alpha, lora_alpha is verl's section default unless it was set."""
    section = _set(cfg, LORA_SECTION)
    if section is _MISSING:
        return
    model, shipped = cfg.actor_rollout_ref.model, base_config().actor_rollout_ref.model
    given = {key: _plain(section[key]) for key in section if key in LORA_KEYS and section[key] is not None}
    if "target_modules" in given:
        given["target_modules"] = hf_target_modules(given["target_modules"])
    if "exclude_modules" in given:
        given["exclude_modules"] = exclude_regex(given["exclude_modules"])
    if given.get("rank", 0) > 0 and "alpha" not in given and model.lora_alpha == shipped.lora_alpha:
        given["alpha"] = float(verl_only_keys()[f"{LORA_SECTION}.alpha"])
    problems = []
    for key, value in given.items():
        ours = LORA_KEYS[key]
        current = _plain(model[ours])
        if current != value and current != _plain(shipped[ours]):
            problems.append(f"{LORA_SECTION}.{key}={value!r} and actor_rollout_ref.model.{ours}={current!r} set the "
                            "same thing (verl 0.9's spelling and the older one) to different values; keep one")
            continue
        with open_dict(model):
            model[ours] = value
    if problems:
        raise ConfigError("\n".join(problems))
    with open_dict(model):
        for key in LORA_KEYS:
            if key in section:
                del section[key]
        if not section:
            del model["lora"]
