"""What the memory estimate needs of each model of a run (`ModelShape`), read from its config.json on torch's meta
device: no weights read, no memory taken."""

from __future__ import annotations

import dataclasses
import os
import re

from omegaconf import DictConfig, OmegaConf

from verl.utils.model_server import served_reward_engine
from verl.utils.run_plan import LoraPlan


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of one model (read from its config.json by `read_model_shape`)."""

    parameters: int
    trainable: int  # all parameters, or LoRA's adapters
    layer_parameters: int  # one decoder layer
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_dim: int  # key/value heads x head dim
    vocab: int  # 0 for a model with a scalar head (the critic, a reward model)
    tied_embedding: int = 0  # parameters the input embedding shares with the LM head (tie_word_embeddings), else 0

    @property
    def root_parameters(self) -> int:
        """The parameters outside the decoder layers: embeddings, final norm, head (FSDP2's root group)."""
        return self.parameters - self.layers * self.layer_parameters

    def saved_per_token(self, compute_bytes: int) -> int:
        """Bytes autograd keeps per token of one decoder layer (the activations row of memory/estimate.py)."""
        return compute_bytes * (8 * self.hidden + 4 * self.intermediate + 2 * self.kv_dim) + 4 * self.heads

    def layer_temporaries(self, compute_bytes: int) -> int:
        """Bytes per token a decoder layer holds at once outside autograd: its MLP's gate, up projection and
        their product, with the layer's input and output."""
        return compute_bytes * (3 * self.intermediate + 2 * self.hidden)


def read_model_shape(
    path: str,
    head: str = "lm",
    lora_rank: int = 0,
    target_modules="all-linear",
    exclude_modules: str | None = None,
    override_config: dict | None = None,
    trust_remote_code: bool = False,
) -> ModelShape:
    """The shape of the model at `path`, built on torch's meta device (no weights read, no memory taken).

    head: "lm" (a causal LM), "token" (the critic's one-label token classifier) or "sequence" (a reward model).
    With `lora_rank`, the trainable parameters are the adapters' r (in + out) per targeted linear layer.
    """
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    config = AutoConfig.from_pretrained(
        os.path.expanduser(path), trust_remote_code=trust_remote_code, **(override_config or {})
    )
    builder = AutoModelForCausalLM
    if head != "lm":
        config.num_labels = 1
        builder = AutoModelForTokenClassification if head == "token" else AutoModelForSequenceClassification
    with torch.device("meta"):
        model = builder.from_config(config, trust_remote_code=trust_remote_code)
    text = config.get_text_config()
    layers = model.base_model.layers
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    parameters = sum(p.numel() for p in model.parameters())
    trainable = parameters
    embedding, output = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head == "lm" and output is not None and output.weight is embedding.weight
    if lora_rank > 0:
        trainable = sum(
            lora_rank * (module.in_features + module.out_features)
            for name, module in layers.named_modules()
            if _lora_targets(name, module, target_modules, exclude_modules)
        )
    return ModelShape(
        parameters=parameters,
        trainable=trainable,
        layer_parameters=sum(p.numel() for p in layers[0].parameters()),
        layers=len(layers),
        hidden=text.hidden_size,
        intermediate=text.intermediate_size,
        heads=heads,
        kv_dim=(getattr(text, "num_key_value_heads", None) or heads) * head_dim,
        vocab=text.vocab_size if head == "lm" else 0,
        tied_embedding=embedding.weight.numel() if tied else 0,
    )


def _lora_targets(name: str, module, target_modules, exclude_modules: str | None) -> bool:
    """Whether peft puts an adapter on `module` (`model.target_modules`: all-linear, or names)."""
    import torch

    if not isinstance(module, torch.nn.Linear) or (exclude_modules and re.fullmatch(exclude_modules, name)):
        return False
    if target_modules == "all-linear":
        return True
    names = target_modules.split(",") if isinstance(target_modules, str) else list(target_modules)
    return name.rsplit(".", 1)[-1] in {n.strip() for n in names}


TEACHER_SHAPE = "teacher "  # the shapes' key of a distillation teacher: "teacher <name>"


def ppo_model_shapes(config: DictConfig, critic: bool, lora: LoraPlan | None) -> dict[str, ModelShape]:
    """The shapes of the run's models: the actor's (with `lora`, the plan's LoRA: only its adapters train), the
    critic's (`critic`), the reward model's (when on) and each distillation teacher's."""
    model = config.actor_rollout_ref.model
    overrides = OmegaConf.to_container(model.override_config, resolve=True)
    shapes = {
        "actor": read_model_shape(
            model.path,
            "lm",
            lora.rank if lora else 0,
            lora.target_modules if lora else "all-linear",
            lora.exclude_modules if lora else None,
            overrides,
            model.trust_remote_code,
        )
    }
    if critic:
        critic_model = config.critic.model
        shapes["critic"] = read_model_shape(
            critic_model.path or model.path,
            "token",
            override_config=OmegaConf.to_container(critic_model.override_config, resolve=True),
            trust_remote_code=critic_model.trust_remote_code,
        )
    if config.reward_model.enable and served_reward_engine(config.reward_model) is None:
        shapes["reward_model"] = read_model_shape(
            config.reward_model.model.path, "sequence", trust_remote_code=config.reward_model.model.trust_remote_code
        )
    distillation = config.get("distillation")
    if distillation is not None and distillation.enabled:  # each teacher's frozen weights beside the actor's
        for name, teacher in distillation.teacher_models.items():
            if teacher.get("model_path"):
                shapes[f"{TEACHER_SHAPE}{name}"] = read_model_shape(teacher.model_path, "lm",
                                                                    trust_remote_code=model.trust_remote_code)
    return shapes
