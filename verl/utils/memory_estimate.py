"""How much memory one rank of a PPO run needs, estimated from the config and the models' config.json before Ray
starts; and the message an out-of-memory error in a step becomes.

The estimate follows what the workers allocate (verl/workers/fsdp_workers.py, actor/dp_actor.py, critic/dp_critic.py,
the rollout engines), phase by phase, for the fullest rank, with every prompt and response at its maximum length.
Symbols: P parameters of a model (T of them trainable: all, or LoRA's adapters), W ranks, L decoder layers, h hidden
size, I MLP size, kv the key/value width (kv heads x head dim), V vocabulary, c bytes of the compute dtype (4 on CPU;
`fsdp_config.dtype` on CUDA, bf16 = 2).

    weights          4 P / W        every model is loaded in float32 and sharded by FSDP2 (param_offload: host)
    optimizer        8 T / W        AdamW's two float32 moments (optimizer_offload: host between updates)
    gradients        4 T / W        sharded; plus c x the root group's weights (embeddings, head) unsharded in backward
    gathered weights c P            the layers gathered by FSDP2 and kept from forward to backward
                                    (reshard_after_forward false, the CPU default); with resharding, the root group
                                    and two layers; none with one rank in float32 (the shard is the whole tensor)
    activations      N L c (8 h + 4 I + 2 kv) + N L 4 heads
                                    what autograd keeps per token of a micro-batch of N tokens (measured on
                                    transformers' Qwen2 layer with sdpa); with gradient checkpointing N L c h (each
                                    layer's input) plus one layer recomputed in the backward (2x its activations)
    logits           R V (4 k + c') R response tokens of the micro-batch; k float32 copies alive at once
                                    (LOGITS_COPIES: logits, logits / T, log-softmax, the gradient; with the entropy
                                    softmax and its products), c' = c for the compute-dtype logits on CUDA
    rollout engine   hf: 4 P (its own float32 copy, freed or moved to host between rollouts with
                     free_cache_engine) + KV cache 2 L kv (prompt + response) 4 per sequence; vllm on CUDA:
                     gpu_memory_utilization of the GPU; vllm on CPU: 4 P + its KV cache (no sleep mode there)
                     other engines (openai: a remote server; the user's own): nothing counted
    process          PROCESS_BYTES per worker process (CUDA context, or on CPU the interpreter with torch)

The phases are the step's (generate, old_log_prob, ref, values, update_critic, update_actor, optimizer_step); a phase
adds its own temporaries to what every process of the rank holds at that time, and the peak is the largest phase.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import re

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.utils.config import ConfigError

GIB = 1024**3
PARAM_BYTES = 4  # model_dtype fp32: the workers load every model in float32
ADAM_BYTES = 8  # AdamW's exp_avg and exp_avg_sq in float32
# A worker process before its models: on CPU the interpreter with torch and transformers (measured 0.45 GiB RSS); on
# CUDA its context.
PROCESS_BYTES = 512 * 1024**2
# Float32 copies of the (response tokens x vocabulary) logits alive at the peak of logprobs_and_entropy and its
# backward (verl/utils/torch_functional.py), by (gradient, entropy); measured with torch 2.13: the logits, logits / T
# and the log-softmax (its gradient replaces logits / T in the backward); the entropy adds the softmax, its product
# with the logits and their gradients.
LOGITS_COPIES = {(False, False): 3, (False, True): 4, (True, False): 3, (True, True): 8}
# With entropy_from_logits_with_chunking: the logits, their gradient and the log-softmax kept per chunk (measured
# 2.3-3.0 without entropy, 4.3 with, for chunks of a third of the positions).
CHUNKED_LOGITS_COPIES = {False: 3, True: 4.5}
# The HF engine: the sampling temporaries of one decoding step (float logits, / T, filtered, softmax, log-softmax,
# entropy) per sequence and vocabulary entry.
SAMPLING_COPIES = 6
COMPUTE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4}
# A warning (not a refusal) when the peak passes this share of the capacity: fragmentation and what the estimate
# leaves out (the driver, Ray, allocator caches) take the rest.
WARN_SHARE = 0.9
MEMORY_CHECKS = ("refuse", "warn", "off")


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

    @property
    def root_parameters(self) -> int:
        """The parameters outside the decoder layers: embeddings, final norm, head (FSDP2's root group)."""
        return self.parameters - self.layers * self.layer_parameters

    def saved_per_token(self, compute_bytes: int) -> int:
        """Bytes autograd keeps per token of one decoder layer (see the module docstring)."""
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


# ------------------------------------------------------------------------------------------------ the estimate
@dataclasses.dataclass
class MemoryEstimate:
    """Bytes per rank, phase by phase: {phase: {part: bytes}}; `capacity` bytes per rank (None: unknown)."""

    phases: dict[str, dict[str, int]]
    capacity: int | None
    capacity_source: str
    device: str

    def total(self, phase: str) -> int:
        return sum(self.phases[phase].values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def peak(self) -> int:
        return self.total(self.peak_phase)

    def fits(self) -> bool:
        return self.capacity is None or self.peak <= self.capacity

    def summary(self) -> str:
        """A few lines for the start of a run: every phase's total and its three largest parts."""
        lines = [
            f"[memory] estimated peak per rank: {gib(self.peak)} in {self.peak_phase}"
            + (
                f", of {gib(self.capacity)} ({self.capacity_source}, {self.peak / self.capacity:.0%})"
                if self.capacity
                else ""
            )
        ]
        lines += [f"[memory]   {self.phase_line(phase)}" for phase in self.phases]
        return "\n".join(lines)

    def phase_line(self, phase: str, aligned: bool = True) -> str:
        """The phase's total and its three largest parts."""
        largest = sorted(self.phases[phase].items(), key=lambda item: -item[1])[:3]
        head = f"{phase:<14} {gib(self.total(phase)):>9}" if aligned else f"{phase} {gib(self.total(phase))}"
        return f"{head}: " + ", ".join(f"{name} {gib(size)}" for name, size in largest)


def gib(size: float) -> str:
    """Bytes for a person: GiB, or MiB below one GiB."""
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 1024**2:.1f} MiB"


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the estimate cannot read from the config alone; the entry point works it out (verl/trainer/main_ppo.py).

    old_log_prob_pass: the actor recomputes old log-probs before the update (ray_trainer.old_log_prob_source).
    update_needs_entropy: the actor's objective reads the token entropy in the update.
    shared_engine_min_parameters: from this many actor parameters, the HF engine on CPU is one per node by default.
    vllm_cpu_kv_cache_bytes: vLLM's KV cache on CPU when neither engine_kwargs nor VLLM_CPU_KVCACHE_SPACE sets it.
    """

    old_log_prob_pass: bool = True
    update_needs_entropy: bool = False
    shared_engine_min_parameters: int = 0
    vllm_cpu_kv_cache_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class _Pass:
    """One model's forward (and backward) pass over micro-batches on one rank."""

    shape: ModelShape
    fsdp: DictConfig
    sequences: int  # per micro-batch
    checkpointing: bool


def _micro_sequences(per_gpu, global_size, dynamic: bool, budget: int, rows: int, length: int, ranks: int) -> int:
    """Sequences in one micro-batch of a rank holding `rows`: the per-GPU size, the deprecated global one / ranks,
    or with use_dynamic_bsz as many full-length sequences as the token budget holds (at least one)."""
    if dynamic:
        size = max(1, budget // length)
    elif per_gpu is not None:
        size = per_gpu
    elif global_size is not None:
        size = max(1, global_size // ranks)
    else:
        size = rows
    return max(1, min(size, rows))


def estimate_ppo_memory(
    config: DictConfig,
    device: str,
    shapes: dict[str, ModelShape],
    facts: RunFacts,
    capacity: int | None = None,
    capacity_source: str = "",
) -> MemoryEstimate:
    """The per-rank estimate of a ppo_trainer config. `shapes`: "actor", and "critic" / "reward_model" when the
    run has them (`ppo_model_shapes`)."""
    arr, data, trainer = config.actor_rollout_ref, config.data, config.trainer
    actor_cfg, rollout, model_cfg = arr.actor, arr.rollout, arr.model
    ranks = trainer.nnodes * trainer.n_gpus_per_node
    cuda = device == "cuda"
    prompt, response = data.max_prompt_length, data.max_response_length
    length = prompt + response
    n = rollout.n
    actor = shapes["actor"]
    rows = data.train_batch_size * n // ranks  # sequences per rank in a step

    def compute_bytes(fsdp) -> int:
        return COMPUTE_BYTES[str(fsdp.get("dtype") or "bfloat16")] if cuda else PARAM_BYTES

    def on_device(offload_key: bool) -> bool:
        return not (cuda and offload_key)  # offloading is a CUDA feature; on CPU everything is in host memory

    def weights(shape: ModelShape, fsdp) -> int:
        offloaded = fsdp.get("param_offload") or fsdp.get("offload_policy")
        return PARAM_BYTES * shape.parameters // ranks if on_device(offloaded) else 0

    def gathered(shape: ModelShape, fsdp) -> int:
        c = compute_bytes(fsdp)
        if ranks == 1 and c == PARAM_BYTES:
            return 0
        reshard = fsdp.get("reshard_after_forward")
        if reshard is None:
            reshard = device != "cpu"
        return c * (shape.root_parameters + 2 * shape.layer_parameters if reshard else shape.parameters)

    def forward_parts(p: _Pass, grad: bool, entropy: bool, extra_copies: float = 0) -> dict[str, int]:
        """A pass's temporaries: the gathered weights, the activations and the logits of one micro-batch."""
        shape, c = p.shape, compute_bytes(p.fsdp)
        tokens, scored = p.sequences * length, p.sequences * response
        parts = {"gathered weights": gathered(shape, p.fsdp)}
        logits = 0
        if shape.vocab:
            chunked = bool(actor_cfg.entropy_from_logits_with_chunking)
            copies = CHUNKED_LOGITS_COPIES[entropy] if chunked and grad else LOGITS_COPIES[(grad, entropy)]
            logits = int(scored * shape.vocab * (PARAM_BYTES * (copies + extra_copies) + (c if cuda else 0)))
        layer = tokens * shape.layer_temporaries(c)
        if not grad:  # the residual stream, then one layer's temporaries at a time, then the head
            parts["hidden states"] = tokens * 2 * c * shape.hidden
            peak = ("logits", logits) if logits >= layer else ("layer temporaries", layer)
        elif p.checkpointing:  # each layer's input; then the head, or one layer recomputed for its backward
            parts["activations"] = tokens * shape.layers * c * shape.hidden
            recomputed = tokens * shape.saved_per_token(c) + layer
            peak = ("logits", logits) if logits >= recomputed else ("recomputed layer", recomputed)
        else:  # every layer's activations; then the head, or one layer's gradient temporaries
            parts["activations"] = tokens * shape.layers * shape.saved_per_token(c)
            peak = ("logits", logits) if logits >= layer else ("layer gradients", layer)
        parts[peak[0]] = peak[1]
        return parts

    def update_parts(p: _Pass, entropy: bool) -> dict[str, int]:
        c = compute_bytes(p.fsdp)
        root_grad = (
            c * p.shape.root_parameters
            if p.shape.trainable == p.shape.parameters and (ranks > 1 or c != PARAM_BYTES)
            else 0
        )
        return {
            **forward_parts(p, grad=True, entropy=entropy),
            "gradients": PARAM_BYTES * p.shape.trainable // ranks + root_grad,
        }

    # ---- what each process of the rank holds between its calls
    use_ref = actor_cfg.use_kl_loss or config.algorithm.use_kl_in_reward
    actor_fsdp = actor_cfg.fsdp_config
    actor_optimizer = ADAM_BYTES * actor.trainable // ranks
    resident = {
        "actor weights": weights(actor, actor_fsdp),
        "actor optimizer": actor_optimizer if on_device(actor_fsdp.optimizer_offload) else 0,
    }
    if use_ref and model_cfg.lora_rank == 0:
        resident["ref weights"] = weights(actor, arr.ref.fsdp_config)
    critic_shape = shapes.get("critic")
    if critic_shape is not None:
        critic_fsdp = config.critic.model.fsdp_config
        critic_optimizer = ADAM_BYTES * critic_shape.trainable // ranks
        resident["critic weights"] = weights(critic_shape, critic_fsdp)
        resident["critic optimizer"] = critic_optimizer if on_device(critic_fsdp.optimizer_offload) else 0
    if "reward_model" in shapes:
        resident["reward model weights"] = weights(shapes["reward_model"], config.reward_model.model.fsdp_config)
    resident["processes"] = PROCESS_BYTES * len([r for r in ("actor", "critic", "reward_model") if r in shapes])

    # ---- the rollout engine
    name = rollout.name if rollout.name != "auto" else ("vllm" if cuda else "hf")
    engine_weights = PARAM_BYTES * actor.parameters
    generate = {}
    if name == "vllm" and cuda:
        capacity_total = capacity or 0
        generate["vllm (gpu_memory_utilization)"] = int(rollout.gpu_memory_utilization * capacity_total)
        if not rollout.free_cache_engine:
            resident["vllm (gpu_memory_utilization)"] = generate.pop("vllm (gpu_memory_utilization)")
    elif name == "vllm":
        kv = (rollout.engine_kwargs.get("vllm") or {}).get("kv_cache_memory_bytes")
        if kv is None:
            space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
            kv = int(float(space) * GIB) if space else facts.vllm_cpu_kv_cache_bytes
        resident["vllm weights"] = engine_weights // rollout.tensor_model_parallel_size
        resident["vllm KV cache"] = int(kv)
    elif name == "hf":  # other engines (a remote server, the user's own) hold nothing the estimate knows of
        setting = rollout.share_cpu_engine
        shared = (
            not cuda
            and ranks > 1
            and trainer.nnodes == 1
            and setting is not False
            and (setting or actor.parameters >= facts.shared_engine_min_parameters)
        )
        gen_rows = (data.gen_batch_size or data.train_batch_size) * n // ranks * (ranks if shared else 1)
        decoding = min(rollout.micro_batch_size or gen_rows, gen_rows)
        # The cache grows by concatenation: the step's new tensors of a layer exist beside the old ones.
        kv_per_sequence = 2 * actor.kv_dim * length * PARAM_BYTES
        generate["hf engine weights"] = engine_weights
        generate["KV cache"] = decoding * kv_per_sequence * (actor.layers + 1)
        generate["prefill"] = (
            decoding * prompt * (2 * PARAM_BYTES * actor.hidden + actor.layer_temporaries(PARAM_BYTES))
            + decoding * actor.vocab * PARAM_BYTES * SAMPLING_COPIES
        )
        if not rollout.free_cache_engine:
            resident["hf engine weights"] = generate.pop("hf engine weights")

    phases = {"generate": {**resident, **generate}}

    # ---- the actor's passes
    checkpointing = bool(model_cfg.enable_gradient_checkpointing)

    def log_prob_pass(node, fsdp) -> _Pass:
        sequences = _micro_sequences(
            node.get("log_prob_micro_batch_size_per_gpu"),
            node.get("log_prob_micro_batch_size"),
            node.log_prob_use_dynamic_bsz,
            node.log_prob_max_token_len_per_gpu,
            rows,
            length,
            ranks,
        )
        return _Pass(actor, fsdp, sequences, checkpointing)

    if facts.old_log_prob_pass:
        sum_pi_squared = 2 if actor_cfg.calculate_sum_pi_squared else 0
        phases["old_log_prob"] = {
            **resident,
            **forward_parts(log_prob_pass(rollout, actor_fsdp), grad=False, entropy=True, extra_copies=sum_pi_squared),
        }
    if use_ref:
        ref_fsdp = actor_fsdp if model_cfg.lora_rank > 0 else arr.ref.fsdp_config
        phases["ref"] = {**resident, **forward_parts(log_prob_pass(arr.ref, ref_fsdp), grad=False, entropy=False)}

    # ---- the critic's passes (its own process on the same rank)
    if critic_shape is not None:
        critic = config.critic
        critic_rows_mini = critic.ppo_mini_batch_size * critic.rollout_n // ranks
        critic_checkpointing = bool(critic.model.enable_gradient_checkpointing)
        forward = _micro_sequences(
            critic.forward_micro_batch_size_per_gpu,
            critic.forward_micro_batch_size,
            critic.use_dynamic_bsz,
            critic.forward_max_token_len_per_gpu,
            rows,
            length,
            ranks,
        )
        train = _micro_sequences(
            critic.ppo_micro_batch_size_per_gpu,
            critic.ppo_micro_batch_size,
            critic.use_dynamic_bsz,
            critic.ppo_max_token_len_per_gpu,
            critic_rows_mini,
            length,
            ranks,
        )
        phases["values"] = {
            **resident,
            **forward_parts(_Pass(critic_shape, critic_fsdp, forward, critic_checkpointing), grad=False, entropy=False),
        }
        phases["update_critic"] = {
            **resident,
            "critic optimizer": critic_optimizer,
            **update_parts(_Pass(critic_shape, critic_fsdp, train, critic_checkpointing), entropy=False),
        }

    # ---- the actor's update: forward and backward of a micro-batch, then the optimizer step
    actor_rows_mini = actor_cfg.ppo_mini_batch_size * n // ranks
    train = _micro_sequences(
        actor_cfg.ppo_micro_batch_size_per_gpu,
        actor_cfg.ppo_micro_batch_size,
        actor_cfg.use_dynamic_bsz,
        actor_cfg.ppo_max_token_len_per_gpu,
        actor_rows_mini,
        length,
        ranks,
    )
    update = update_parts(_Pass(actor, actor_fsdp, train, checkpointing), entropy=facts.update_needs_entropy)
    phases["update_actor"] = {**resident, "actor optimizer": actor_optimizer, **update}
    # AdamW's foreach step makes one temporary per moment tensor (the denominator).
    phases["optimizer_step"] = {
        **resident,
        "actor optimizer": actor_optimizer,
        "gradients": PARAM_BYTES * actor.trainable // ranks,
        "optimizer temporaries": PARAM_BYTES * actor.trainable // ranks,
    }
    return MemoryEstimate(phases, capacity, capacity_source, device)


# ------------------------------------------------------------------------------------------------ the check
def device_capacity(device: str, ranks_per_node: int) -> tuple[int, str]:
    """Bytes one rank may use and where the figure comes from: a GPU's total memory, or on CPU the available RAM
    (the smaller of the system's and a cgroup limit's) shared by the node's ranks."""
    if device == "cuda":
        import torch

        total = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
        return total, "total memory of one GPU"
    import psutil

    available = psutil.virtual_memory().available
    limit = _cgroup_room()
    if limit is not None and limit < available:
        available = limit
    return available // ranks_per_node, f"available RAM / {ranks_per_node} ranks on the node"


def _cgroup_room() -> int | None:
    """Bytes left under a cgroup v2 memory limit (containers), or None without one."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def ppo_model_shapes(config: DictConfig, critic: bool) -> dict[str, ModelShape]:
    """The shapes of the run's models: the actor's, the critic's (`critic`) and the reward model's (when on)."""
    model = config.actor_rollout_ref.model
    overrides = OmegaConf.to_container(model.override_config, resolve=True)
    shapes = {
        "actor": read_model_shape(
            model.path,
            "lm",
            model.lora_rank,
            model.target_modules,
            model.get("exclude_modules"),
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
    if config.reward_model.enable:
        shapes["reward_model"] = read_model_shape(
            config.reward_model.model.path, "sequence", trust_remote_code=config.reward_model.model.trust_remote_code
        )
    return shapes


# The keys that shrink a run, in the order they are suggested: (key, kind); kind "size" keys are searched for the
# largest value that fits, "flag" keys are tried switched on, "down" keys (floats) for the largest value that fits.
def _remedies(config: DictConfig, device: str) -> list[tuple[str, str]]:
    arr, critic = config.actor_rollout_ref, config.critic
    keys = []
    if arr.actor.use_dynamic_bsz:
        keys.append(("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "size"))
    else:
        keys.append(("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "size"))
    for node in ("rollout", "ref"):
        if arr[node].log_prob_use_dynamic_bsz:
            keys.append((f"actor_rollout_ref.{node}.log_prob_max_token_len_per_gpu", "size"))
        else:
            keys.append((f"actor_rollout_ref.{node}.log_prob_micro_batch_size_per_gpu", "size"))
    if critic.use_dynamic_bsz:
        keys += [("critic.ppo_max_token_len_per_gpu", "size"), ("critic.forward_max_token_len_per_gpu", "size")]
    else:
        keys += [("critic.ppo_micro_batch_size_per_gpu", "size"), ("critic.forward_micro_batch_size_per_gpu", "size")]
    keys += [
        ("actor_rollout_ref.model.enable_gradient_checkpointing", "flag"),
        ("critic.model.enable_gradient_checkpointing", "flag"),
        ("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "flag"),
        ("actor_rollout_ref.rollout.free_cache_engine", "flag"),
        ("actor_rollout_ref.rollout.micro_batch_size", "size"),
    ]
    if device == "cuda":
        keys += [
            ("actor_rollout_ref.rollout.gpu_memory_utilization", "down"),
            ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "flag"),
            ("actor_rollout_ref.actor.fsdp_config.param_offload", "flag"),
            ("actor_rollout_ref.ref.fsdp_config.param_offload", "flag"),
            ("critic.model.fsdp_config.optimizer_offload", "flag"),
            ("critic.model.fsdp_config.param_offload", "flag"),
        ]
    keys.append(("actor_rollout_ref.rollout.n", "size"))
    return keys


def suggest_fixes(config: DictConfig, device: str, estimate_with, capacity: int, current_peak: int) -> list[str]:
    """Single-key changes, each re-estimated (`estimate_with(config)` -> MemoryEstimate): the largest value of a size
    key (or the switch) that fits, else what it saves."""
    fixes = []
    for key, kind in _remedies(config, device):
        value = OmegaConf.select(config, key)
        if kind == "flag":
            if value:
                continue
            peak = _peak_with(config, estimate_with, key, True)
            if peak < current_peak:
                verdict = "fits" if peak <= capacity else f"saves {gib(current_peak - peak)}, not enough alone"
                fixes.append(f"{key}=true: peak {gib(peak)} ({verdict})")
            continue
        if kind == "down":
            top = value
            candidates = [round(value * k / 20, 2) for k in range(19, 0, -1)]
        else:
            top = value or _current_size(config, key)
            if not top or top <= 1:
                continue
            candidates = sorted({max(1, top * k // 16) for k in range(15, 0, -1)} | {1}, reverse=True)
            candidates = [v for v in candidates if v < top]
        now = value if value is not None else f"null = {top}"
        for candidate in candidates:
            peak = _peak_with(config, estimate_with, key, candidate)
            if peak <= capacity:
                fixes.append(f"{key}={candidate} (now {now}): peak {gib(peak)}")
                break
        else:
            if candidates:
                peak = _peak_with(config, estimate_with, key, candidates[-1])
                if peak < current_peak:
                    fixes.append(
                        f"{key}={candidates[-1]} (now {now}): peak {gib(peak)} (saves "
                        f"{gib(current_peak - peak)}, not enough alone)"
                    )
    return fixes


def _current_size(config: DictConfig, key: str) -> int | None:
    """A null micro-batch size means the whole share of the rank: its value for the search."""
    ranks = config.trainer.nnodes * config.trainer.n_gpus_per_node
    rows = config.data.train_batch_size * config.actor_rollout_ref.rollout.n // ranks
    if key.endswith("ppo_micro_batch_size_per_gpu"):
        node = config.critic if key.startswith("critic") else config.actor_rollout_ref.actor
        return node.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n // ranks
    if key.endswith("micro_batch_size_per_gpu") or key.endswith("rollout.micro_batch_size"):
        return rows
    return None


def _peak_with(config: DictConfig, estimate_with, key: str, value) -> int:
    changed = copy.deepcopy(config)
    with open_dict(changed):
        OmegaConf.update(changed, key, value, force_add=True)
    return estimate_with(changed).peak


def check_ppo_memory(
    config: DictConfig, device: str, facts: RunFacts, shapes: dict[str, ModelShape] | None = None, critic: bool = False
) -> MemoryEstimate | None:
    """Print the per-rank estimate and, per `trainer.memory_check`, refuse (ConfigError) or warn when the peak does
    not fit the capacity (`trainer.memory_per_rank_gb`, else the device's). None when the models' shapes cannot be
    read (the workers then report the model's problem themselves)."""
    trainer = config.trainer
    mode = trainer.memory_check
    if mode == "off":
        return None
    if shapes is None:
        try:
            shapes = ppo_model_shapes(config, critic)
        except Exception as err:  # a broken or unusual model directory: loading it will say what is wrong
            print(f"[memory] no estimate: cannot build the model's shape ({type(err).__name__}: {err})")
            return None
    if trainer.memory_per_rank_gb is not None:
        capacity, source = int(trainer.memory_per_rank_gb * GIB), "trainer.memory_per_rank_gb"
    else:
        capacity, source = device_capacity(device, trainer.n_gpus_per_node)

    def estimate_with(cfg: DictConfig) -> MemoryEstimate:
        return estimate_ppo_memory(cfg, device, shapes, facts, capacity, source)

    estimate = estimate_with(config)
    print(estimate.summary())
    if estimate.peak <= WARN_SHARE * capacity:
        return estimate
    if estimate.fits():
        print(
            f"[memory] warning: the estimated peak is {estimate.peak / capacity:.0%} of the capacity; little "
            "room is left for what the estimate leaves out (the allocator's caches, fragmentation)"
        )
        return estimate
    fixes = suggest_fixes(config, device, estimate_with, capacity, estimate.peak)
    message = (
        f"the run needs about {gib(estimate.peak)} per rank in {estimate.peak_phase}, more than the "
        f"{gib(capacity)} a rank has ({source}): {estimate.phase_line(estimate.peak_phase, aligned=False)}.\n"
        "Single changes, each re-estimated:\n  "
        + (
            "\n  ".join(fixes)
            if fixes
            else "none of the batch keys helps: use more ranks "
            "(trainer.n_gpus_per_node, trainer.nnodes) or a smaller model"
        )
        + "\nOr set trainer.memory_check=warn to start anyway (the estimate assumes every prompt and "
        "response at its maximum length)."
    )
    if mode == "warn":
        print(f"[memory] warning: {message}")
        return estimate
    raise ConfigError(message)


# ------------------------------------------------------------------------------------------------ out of memory
# The keys that size each phase of a step (the names of RayPPOTrainer._step's timers).
PHASE_KEYS = {
    "gen": [
        "actor_rollout_ref.rollout.micro_batch_size (hf)",
        "actor_rollout_ref.rollout.gpu_memory_utilization (vllm)",
        "actor_rollout_ref.rollout.n",
        "data.max_response_length",
    ],
    "old_log_prob": [
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu (or with use_dynamic_bsz "
        "log_prob_max_token_len_per_gpu)",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking",
    ],
    "ref": [
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu (or with use_dynamic_bsz "
        "log_prob_max_token_len_per_gpu)",
        "actor_rollout_ref.ref.fsdp_config.param_offload",
    ],
    "values": ["critic.forward_micro_batch_size_per_gpu (or with use_dynamic_bsz forward_max_token_len_per_gpu)"],
    "update_critic": [
        "critic.ppo_micro_batch_size_per_gpu (or with use_dynamic_bsz ppo_max_token_len_per_gpu)",
        "critic.model.enable_gradient_checkpointing",
        "critic.model.fsdp_config.optimizer_offload",
    ],
    "update_actor": [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (or with use_dynamic_bsz ppo_max_token_len_per_gpu)",
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload / param_offload",
    ],
}
PHASE_KEYS["gen_max"] = PHASE_KEYS["gen"]
PHASE_KEYS["testing"] = ["data.val_batch_size", "actor_rollout_ref.rollout.val_kwargs.n"] + PHASE_KEYS["gen"][:2]
PHASE_KEYS["reward"] = [
    "reward_model.micro_batch_size_per_gpu (or with use_dynamic_bsz forward_max_token_len_per_gpu)",
    "reward_model.model.fsdp_config.param_offload",
]
PHASE_NAMES = {"gen": "generate", "gen_max": "generate (greedy baseline)", "testing": "validation"}


class OutOfMemory(ConfigError):
    """A step ran out of memory; the message names the phase and the keys that size it."""


def out_of_memory_cause(err: BaseException) -> BaseException | None:
    """The out-of-memory error behind `err` (itself, the worker's error a Ray task error carries, or one in its
    chain), else None: MemoryError, torch's OutOfMemoryError (CUDA), the CPU allocator's "can't allocate memory", or
    Ray's OutOfMemoryError (its memory monitor killed the worker)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        carried = getattr(err, "cause", None)  # ray.exceptions.RayTaskError: the worker's own exception
        if isinstance(carried, BaseException):
            err = carried
            continue
        if (
            isinstance(err, MemoryError)
            or type(err).__name__ == "OutOfMemoryError"
            or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err))
        ):
            return err
        err = err.__cause__
    return None


@contextlib.contextmanager
def name_out_of_memory(phase: str):
    """Within the block, an out-of-memory error becomes `OutOfMemory` naming `phase` and the keys to lower."""
    try:
        yield
    except OutOfMemory:
        raise
    except Exception as err:
        cause = out_of_memory_cause(err)
        if cause is None:
            raise
        keys = PHASE_KEYS.get(phase, ["the micro-batch sizes of that phase"])
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise OutOfMemory(
            f"out of memory in the {PHASE_NAMES.get(phase, phase)} phase of a step "
            f"({type(cause).__name__}: "
            f"{first_line[:300]}). Lower: "
            + "; ".join(keys)
            + ". The [memory] lines at the start of the run estimate each phase."
        ) from err
