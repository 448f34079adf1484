"""How much memory one rank of a PPO run needs, estimated before Ray starts from the run plan
(verl/trainer/ppo/run_plan.py), the config's memory settings and the models' config.json; the micro-batch sizes a
config leaves unset, chosen from that estimate; and the message an out-of-memory error in a step becomes.

The estimate follows what the workers allocate (verl/workers/fsdp_workers.py, actor/dp_actor.py, critic/dp_critic.py,
the rollout engines), phase by phase, for the fullest rank, with every prompt and response at its maximum length.
Symbols: P parameters of a model (T of them trainable: all, or LoRA's adapters), S ranks of its FSDP2 shard group
(plan.*_fsdp_size: every rank, or HSDP's fsdp_size), L decoder layers, h hidden size, I MLP size, kv the key/value
width (kv heads x head dim), V vocabulary, N tokens and R response tokens of a micro-batch (its sequences x the
maximum lengths), w bytes of the parameters' dtype (the plan's *_param_dtype: fsdp_config.model_dtype, float32 = 4),
c bytes of the plan's compute dtype (the parameters' on CPU; `fsdp_config.dtype` on CUDA, bf16 = 2).

    weights          w P / S        each model in its model_dtype, sharded by FSDP2 (param_offload: host)
    optimizer        8 T / S        AdamW's two float32 moments (optimizer_offload: host between updates); with
                                    w < 4 also the float32 masters, 4 T / S
    gradients        w T / S        sharded; plus c x the root group's weights (embeddings, head) unsharded in backward;
                                    the plain head tied to the embedding (E parameters): 2 g E more at the backward's
                                    end (g: c when the root group is unsharded, else w), beside the gradients alone
    gathered weights c P            the layers gathered by FSDP2 and kept from forward to backward
                                    (reshard_after_forward false, the CPU default); with resharding, the root group
                                    and two layers; none with one rank in float32 (the shard is the whole tensor)
    activations      N L c (8 h + 4 I + 2 kv) + N L 4 heads
                                    what autograd keeps per token of a micro-batch of N tokens (measured on
                                    transformers' Qwen2 layer with sdpa); with gradient checkpointing N L c h (each
                                    layer's input) plus one layer recomputed in the backward (2x its activations);
                                    with activation offload (CUDA) one layer's instead of L
    logits           R V (4 k + c') R response tokens of the micro-batch; k float32 copies alive at once
                                    (LOGITS_COPIES: logits, logits / T, log-softmax, the gradient; with the entropy
                                    softmax and its products), c' = c for the compute-dtype logits on CUDA; with the
                                    fused log-probs min(R, CHUNK_TOKENS) V 4 FUSED_LOGITS_COPIES
    rollout engine   the plan's engine. hf: e P (its own copy in hf_engine_dtype: e = 4 on CPU, rollout.dtype's on
                     CUDA; freed or moved to host between rollouts with free_cache_engine) + KV cache 2 L kv
                     (prompt + response) e per sequence it decodes (the rank's prompts x n, the node's with
                     share_cpu_engine; the static loop: the prompt bucketed to 64 tokens, and on CUDA, whose graphs
                     read them where they were captured, the copy and the cache kept all step, and the graphs'
                     pool of the step's sampling temporaries, SAMPLING_COPIES V 4 per sequence); vllm and sglang
                     on CUDA: gpu_memory_utilization of the GPU; trtllm on CUDA: its weights in rollout.dtype all
                     run + gpu_memory_utilization of the memory left free for its KV cache; vllm on CPU: 4 P +
                     2 V h 4 (its CPU backend packs a copy of the input embedding and of the LM head for its
                     matmuls, tied or not) + its KV cache (no sleep mode there); other engines (openai: a remote
                     server; the user's own): nothing counted
    reward server    a served generative reward model on CUDA: reward_model.rollout.gpu_memory_utilization of the
                     GPU, all run
    process          PROCESS_BYTES per worker process (CUDA context, or on CPU the interpreter with torch), on a CPU
                     with VLLM_CPU_RUNTIME_BYTES more in the one that runs vLLM

The phases are the step's that the plan runs: generate, old_log_prob (old_log_prob_source=recompute), ref (a
reference policy), values and update_critic (a critic), update_actor, optimizer_step. A phase adds its own
temporaries to what every process of the rank holds at that time, and the peak is the largest phase.

A micro-batch holds the plan's size of sequences, with use_dynamic_bsz as many full-length sequences as its token
budget holds, and the whole share (the mini-batch of an update, the rank's rows of a forward pass) when unset. The
check (`check_ppo_memory`) first sizes every unset one (`size_micro_batches`): the largest divisor of its share that
holds at most the pass's token budget (`*_max_token_len_per_gpu`) of full-length sequences and whose phase fits
WARN_SHARE of the capacity, each phase on its own; 1 when none does, and then the refusal names the levers that
remain.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import re
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf, open_dict

from verl.utils.config import ConfigError
from verl.utils.fsdp_utils import (
    COMPUTE_DTYPES,
    adamw_is_fused,
    offloads_optimizer_state,
    params_in_host_memory,
    reshards_after_forward,
)
from verl.utils.fused_logprobs import CHUNK_TOKENS
from verl.utils.lora import lora_settings
from verl.utils.model_server import served_reward_engine
from verl.utils.run_plan import MicroBatches, RunPlan
from verl.utils.torch_functional import LOGITS_CHUNK, STATIC_PROMPT_BUCKET

GIB = 1024**3
FLOAT32_BYTES = 4
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}  # the plan's dtype names
ADAM_BYTES = 8  # AdamW's exp_avg and exp_avg_sq in float32
# A worker process before its models: on CPU the interpreter with torch and transformers (measured 0.45 GiB RSS); on
# CUDA its context.
PROCESS_BYTES = 512 * 1024**2
# vLLM's KV cache per rank on a CPU unless engine_kwargs.vllm.kv_cache_memory_bytes or VLLM_CPU_KVCACHE_SPACE sets it
# (verl/workers/rollout/vllm_rollout.py starts the engine with it): a fixed size, as vLLM's CPU backend would otherwise
# read gpu_memory_utilization as a share of all host memory.
VLLM_CPU_KV_CACHE_BYTES = 1 << 30
# vLLM's CPU backend keeps its float32 weights and, for the vocabulary matrices, also a copy packed for its matmul
# kernels (the linear layers' packed copy replaces their weight): one of the input embedding and one of the LM head,
# tied or not. Measured on engines alone at hidden 896, 24 layers, 1 GiB of KV cache: 1.04 GiB above weights and cache
# at vocabulary 151,936 (2 x 0.51), 0.26 at 32,000 (2 x 0.11), the same untied and with 12 layers.
VLLM_CPU_PACKED_VOCAB_COPIES = 2
# What a worker process holds more once a vLLM engine has run in it on a CPU, its models aside: the libraries and
# kernels vLLM loads on first use (measured: 0.41 GiB RSS with torch, transformers and the workers imported, 0.68 after
# a tiny engine had generated and been deleted).
VLLM_CPU_RUNTIME_BYTES = 256 * 1024**2
# Float32 copies of the (response tokens x vocabulary) logits alive at the peak of logprobs_and_entropy and its
# backward (verl/utils/torch_functional.py), by (gradient, entropy); measured with torch 2.13: the logits, logits / T
# and the log-softmax (its gradient replaces logits / T in the backward); the entropy adds the softmax, its product
# with the logits and their gradients.
LOGITS_COPIES = {(False, False): 3, (False, True): 4, (True, False): 3, (True, True): 8}
# With entropy_from_logits_with_chunking, by entropy: float32 copies of one chunk's (LOGITS_CHUNK positions x
# vocabulary) logits alive at once (its float32 copy, log-softmax, softmax, their gradients), on top of the whole
# micro-batch's logits and their gradient (2 copies), which the LM head makes before any chunk. Measured at the
# Qwen2.5-0.5B shape: 4.2 copies in all with one chunk without the entropy, 9.2 with it (benchmarks/memory_levers.py);
# 2.3-3.0 and 4.3 for chunks of a third of the positions.
CHUNKED_LOGITS_COPIES = {False: 2, True: 7}
# The fused log-probs (model.use_fused_kernels): float32 (FUSED_CHUNK, vocabulary) tensors alive at once in a chunk
# of the forward or of its recomputing backward (the logits, their softmax, the gradient).
FUSED_LOGITS_COPIES = 3
# The HF engine: the sampling temporaries of one decoding step (float logits, / T, filtered, softmax, log-softmax,
# entropy) per sequence and vocabulary entry.
SAMPLING_COPIES = 6
# A warning (not a refusal) when the peak passes this share of the capacity: fragmentation and what the estimate
# leaves out (the driver, Ray, allocator caches) take the rest. The sizing of unset micro-batches aims below it.
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
    tied_embedding: int = 0  # parameters the input embedding shares with the LM head (tie_word_embeddings), else 0

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

    def to_dict(self) -> dict:
        """The figures a run keeps (memory_estimate.json), to compare with the measured peak."""
        return {
            "device": self.device,
            "capacity_bytes": self.capacity,
            "peak_phase": self.peak_phase,
            "peak_bytes": self.peak,
            "phases": {phase: self.total(phase) for phase in self.phases},
        }

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


# The plan's micro-batched passes (RunPlan fields) and the phase of the estimate each one sizes.
PASS_PHASES = {
    "actor_update": "update_actor",
    "actor_log_prob": "old_log_prob",
    "ref_log_prob": "ref",
    "critic_update": "update_critic",
    "critic_forward": "values",
}


def _planned_passes(plan: RunPlan) -> dict[str, tuple[MicroBatches, int]]:
    """The micro-batched passes the plan's step runs: {field: (MicroBatches, share)}, the share being the sequences
    the pass cuts into micro-batches (an update's mini-batch, a forward pass's rows of the rank)."""
    runs = {
        "actor_update": True,
        "actor_log_prob": plan.old_log_prob_source == "recompute",
        "ref_log_prob": plan.use_reference_policy,
        "critic_update": plan.critic_update is not None,
        "critic_forward": plan.critic_forward is not None,
    }
    passes = {}
    for field, on in runs.items():
        if not on:
            continue
        batches = getattr(plan, field)
        if field.endswith("_update"):
            passes[field] = (batches.micro, batches.mini_batch)
        else:  # a sequence-parallel group's ranks hold the same rows: the rows of its data-parallel share
            sp = plan.critic_sequence_parallel if field == "critic_forward" else plan.sequence_parallel
            passes[field] = (batches, plan.rows_per_rank * sp)
    return passes


def _with_micro(plan: RunPlan, field: str, micro: MicroBatches) -> RunPlan:
    """The plan with one pass's micro-batches replaced."""
    if field.endswith("_update"):
        micro = dataclasses.replace(getattr(plan, field), micro=micro)
    return dataclasses.replace(plan, **{field: micro})


def _sequence_length(config: DictConfig) -> int:
    """The longest sequence a pass sees: the prompt and the response at their max lengths."""
    return config.data.max_prompt_length + config.data.max_response_length


def _sequences(micro: MicroBatches, share: int, length: int) -> int:
    """Sequences in one micro-batch of a pass over `share` sequences of up to `length` tokens: the planned size, the
    whole share when unset, or with a token budget as many full-length sequences as it holds (at least one)."""
    size = max(1, micro.max_token_len // length) if micro.dynamic else micro.size or share
    return max(1, min(size, share))


def _generate_rows(config: DictConfig, plan: RunPlan) -> int:
    """Sequences the rank's HF engine decodes in a step: the rank's prompts x n, the node's on a shared engine."""
    prompts = config.data.gen_batch_size or config.data.train_batch_size
    rows = prompts * plan.rollout_n // plan.n_ranks
    return rows * plan.ranks_per_node if plan.share_cpu_engine else rows


@dataclasses.dataclass(frozen=True)
class _Pass:
    """One model's forward (and backward) pass over micro-batches on one rank."""

    shape: ModelShape
    fsdp: DictConfig
    compute_bytes: int
    sequences: int  # per micro-batch
    checkpointing: bool
    param_bytes: int = FLOAT32_BYTES  # the parameters' dtype (fsdp_config.model_dtype)
    shard: int = 1  # ranks of its FSDP2 shard group (HSDP: fsdp_size)
    sp: int = 1  # ranks of its Ulysses group: each holds 1/sp of every sequence's tokens
    accumulates: bool = False  # an update of several micro-batches: gradients from the earlier ones are held


def estimate_ppo_memory(
    config: DictConfig,
    plan: RunPlan,
    shapes: dict[str, ModelShape],
    capacity: int | None = None,
    capacity_source: str = "",
) -> MemoryEstimate:
    """The per-rank estimate of a run: its facts from `plan` (a RunPlan), the memory settings (offload, gradient
    checkpointing, logits chunking, the engine's cache) and lengths from `config`. `shapes`: "actor", and "critic" /
    "reward_model" when the run has them (`ppo_model_shapes`)."""
    arr, data = config.actor_rollout_ref, config.data
    actor_cfg, rollout, model_cfg = arr.actor, arr.rollout, arr.model
    cuda = plan.device == "cuda"
    prompt, response = data.max_prompt_length, data.max_response_length
    length = _sequence_length(config)
    actor = shapes["actor"]
    actor_bytes, ref_bytes = DTYPE_BYTES[plan.actor_param_dtype], DTYPE_BYTES[plan.ref_param_dtype]
    actor_shard = plan.actor_fsdp_size
    passes = _planned_passes(plan)

    def sequences(field: str) -> int:
        return _sequences(*passes[field], length)

    def accumulates(field: str) -> bool:
        """Whether the update's mini-batch takes more than one micro-batch (gradients then accumulate)."""
        return sequences(field) < passes[field][1]

    def weights(shape: ModelShape, fsdp, param_bytes: int, shard: int) -> int:
        return 0 if params_in_host_memory(plan.device, fsdp) else param_bytes * shape.parameters // shard

    def optimizer_between_updates(fsdp, size: int) -> int:
        """The optimizer's state on the device between updates: not with optimizer_offload (the workers' own rule,
        `offloads_optimizer_state`), nor with the parameters in host memory (FSDP2 then steps the optimizer there,
        its state never on the device). Offloading is a CUDA feature: on CPU everything is in host memory."""
        offloaded = offloads_optimizer_state(plan.device, fsdp) or params_in_host_memory(plan.device, fsdp)
        return 0 if offloaded else size

    def optimizer(shape: ModelShape, param_bytes: int, shard: int) -> int:
        """AdamW's moments, and the float32 masters of parameters held in a lower precision."""
        return (ADAM_BYTES + (FLOAT32_BYTES if param_bytes < FLOAT32_BYTES else 0)) * shape.trainable // shard

    def gathered(p: _Pass) -> int:
        if p.shard == 1 and p.compute_bytes == p.param_bytes:
            return 0
        reshard = reshards_after_forward(plan.device, p.fsdp)
        layers = p.shape.root_parameters + 2 * p.shape.layer_parameters if reshard else p.shape.parameters
        return p.compute_bytes * layers

    def pass_parts(p: _Pass, grad: bool, entropy: bool, extra_copies: float = 0):
        """A pass's temporaries besides its peak: the gathered weights and what it keeps per token; and its two
        candidate peaks, the head's logits (bytes) and the largest layer temporaries (name, bytes)."""
        shape, c = p.shape, p.compute_bytes
        tokens, scored = -(-p.sequences * length // p.sp), -(-p.sequences * response // p.sp)
        parts = {"gathered weights": gathered(p)}
        if p.sp > 1:  # the full-sequence attention mask every rank builds (verl/utils/ulysses.full_sequence_mask)
            parts["sequence-parallel mask"] = p.sequences * length * length
        logits = 0
        if shape.vocab and plan.fused_logprobs and not extra_copies:  # a chunk of tokens at a time (no full logits)
            logits = int(min(scored, CHUNK_TOKENS) * shape.vocab * FLOAT32_BYTES * FUSED_LOGITS_COPIES)
        elif shape.vocab and grad and actor_cfg.entropy_from_logits_with_chunking:
            chunk = min(scored, LOGITS_CHUNK)
            logits = int(shape.vocab * FLOAT32_BYTES * (scored * (2 + extra_copies) + chunk * CHUNKED_LOGITS_COPIES[entropy])
                         + scored * shape.vocab * (c if cuda else 0))
        elif shape.vocab:
            copies = LOGITS_COPIES[(grad, entropy)]
            logits = int(scored * shape.vocab * (FLOAT32_BYTES * (copies + extra_copies) + (c if cuda else 0)))
        layer = tokens * shape.layer_temporaries(c)
        # With activation offload (CUDA) what autograd saves waits in host memory: one layer's is on the device.
        saved_layers = 1 if plan.activation_offload and shape.vocab else shape.layers
        if not grad:  # the residual stream, then one layer's temporaries at a time, then the head
            parts["hidden states"] = tokens * 2 * c * shape.hidden
            return parts, logits, ("layer temporaries", layer)
        if p.checkpointing:  # each layer's input; then the head, or one layer recomputed for its backward
            parts["activations"] = tokens * saved_layers * c * shape.hidden
            return parts, logits, ("recomputed layer", tokens * shape.saved_per_token(c) + layer)
        # every layer's activations; then the head, or one layer's gradient temporaries
        parts["activations"] = tokens * saved_layers * shape.saved_per_token(c)
        return parts, logits, ("layer gradients", layer)

    def forward_parts(p: _Pass, grad: bool, entropy: bool, extra_copies: float = 0) -> dict[str, int]:
        """A pass's temporaries: the gathered weights, the activations and the logits of one micro-batch."""
        parts, logits, (name, layer) = pass_parts(p, grad, entropy, extra_copies)
        parts.update({"logits": logits} if logits >= layer else {name: layer})
        return parts

    def update_parts(p: _Pass, entropy: bool) -> dict[str, int]:
        """A micro-batch's forward and backward. The backward starts at the head: the logits' peak comes before any
        layer's gradient exists -- only the head's own, with the fused log-probs, which accumulate it chunk by chunk
        (the plain head computes it after the logits' gradient) --, and every gradient exists only at its end, when
        the logits are gone. The peak is the larger of the two moments."""
        c = p.compute_bytes
        # FSDP2 reduces each layer's unsharded gradient as it is made; the root group's (embeddings, head) stays
        # unsharded until the end of the backward. One float32 rank holds its whole gradients (no gathering).
        unsharded = p.shape.trainable == p.shape.parameters and (p.shard > 1 or c != p.param_bytes)
        root_grad = c * p.shape.root_parameters if unsharded else 0
        gradients = p.param_bytes * p.shape.trainable // p.shard + root_grad
        head_grad = 0
        if plan.fused_logprobs and p.shape.vocab and p.shape.trainable == p.shape.parameters:
            head_grad = root_grad or p.param_bytes * p.shape.root_parameters
        # After the first micro-batch of a mini-batch the earlier ones' (reduced, sharded) gradients are there too.
        held = p.param_bytes * p.shape.trainable // p.shard if p.accumulates else 0
        parts, logits, (name, layer) = pass_parts(p, grad=True, entropy=entropy)
        # The plain head tied to the input embedding (tie_word_embeddings) gets its gradient twice: autograd holds
        # the head's part until the embedding's own arrives at the very end of the backward, then sums the two: two
        # more copies of the embedding's gradient beside all the others, when the layers' activations and gathered
        # weights are gone (measured at the 0.5B shape on one CPU rank: 8.38 GiB against 7.55 without this moment;
        # not with the fused head, whose update stayed within its logits' peak, benchmarks/memory_levers.py).
        end = {}
        if p.shape.tied_embedding and p.shape.trainable == p.shape.parameters and not plan.fused_logprobs:
            end = {"gradients": gradients,
                   "tied embedding gradients": 2 * (c if unsharded else p.param_bytes) * p.shape.tied_embedding}
            if parts["gathered weights"]:  # the root group stays gathered to its end
                end["gathered weights"] = min(parts["gathered weights"], c * p.shape.root_parameters)
        if logits + head_grad + held >= gradients + layer:
            parts["logits"] = logits
            if head_grad:
                parts["head gradient"] = head_grad
            if held:
                parts["accumulated gradients"] = held
        else:
            parts[name] = layer
            parts["gradients"] = gradients
        return end if sum(end.values()) > sum(parts.values()) else parts

    # ---- what each process of the rank holds between its calls
    actor_fsdp = actor_cfg.fsdp_config
    actor_optimizer = optimizer(actor, actor_bytes, actor_shard)
    resident = {
        "actor weights": weights(actor, actor_fsdp, actor_bytes, actor_shard),
        "actor optimizer": optimizer_between_updates(actor_fsdp, actor_optimizer),
    }
    lora = lora_settings(model_cfg)
    if plan.use_reference_policy and lora is None:
        resident["ref weights"] = weights(actor, arr.ref.fsdp_config, ref_bytes, actor_shard)
    if plan.use_critic:
        critic_shape, critic_fsdp = shapes["critic"], config.critic.model.fsdp_config
        critic_bytes, critic_shard = DTYPE_BYTES[plan.critic_param_dtype], plan.critic_fsdp_size
        critic_optimizer = optimizer(critic_shape, critic_bytes, critic_shard)
        resident["critic weights"] = weights(critic_shape, critic_fsdp, critic_bytes, critic_shard)
        resident["critic optimizer"] = optimizer_between_updates(critic_fsdp, critic_optimizer)
    if plan.use_reward_model:
        resident["reward model weights"] = weights(shapes["reward_model"], config.reward_model.model.fsdp_config,
                                                   FLOAT32_BYTES, plan.reward_model_fsdp_size)
    resident["processes"] = PROCESS_BYTES * plan.processes_per_rank
    if plan.reward_model_server and cuda:
        # The served generative reward model shares the first GPUs with the ranks for the whole run: its share of a
        # GPU's memory is taken on the fullest rank's (counted on every rank: the estimate is the fullest's).
        share = config.reward_model.rollout.gpu_memory_utilization
        resident["served reward model (reward_model.rollout.gpu_memory_utilization)"] = int(share * (capacity or 0))

    # ---- the rollout engine
    name = plan.rollout_engine
    engine_weights = FLOAT32_BYTES * actor.parameters  # vLLM's CPU build loads its own float32 copy
    generate = {}
    if name in ("vllm", "sglang") and cuda:  # each claims its fraction of the GPU (SGLang: mem_fraction_static)
        claim = f"{name} (gpu_memory_utilization)"
        generate[claim] = int(rollout.gpu_memory_utilization * (capacity or 0))
        if not rollout.free_cache_engine:
            resident[claim] = generate.pop(claim)
    elif name == "vllm":
        kv = (rollout.engine_kwargs.get("vllm") or {}).get("kv_cache_memory_bytes")
        if kv is None:
            space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
            kv = int(float(space) * GIB) if space else VLLM_CPU_KV_CACHE_BYTES
        resident["processes"] += VLLM_CPU_RUNTIME_BYTES
        resident["vllm weights"] = engine_weights // rollout.tensor_model_parallel_size
        resident["vllm packed vocabulary matrices"] = (
            VLLM_CPU_PACKED_VOCAB_COPIES * actor.vocab * actor.hidden * FLOAT32_BYTES
            // rollout.tensor_model_parallel_size)  # both are split over the tensor-parallel ranks
        resident["vllm KV cache"] = int(kv)
    elif name == "trtllm" and cuda:
        # Its own copy of the weights in rollout.dtype, never released (sleep frees only the KV cache), and a KV
        # cache of gpu_memory_utilization of what is free when it starts (free_gpu_memory_fraction).
        weights_bytes = DTYPE_BYTES.get(COMPUTE_DTYPES.get(str(rollout.dtype), ""), 2) * actor.parameters
        resident["trtllm weights"] = weights_bytes // rollout.tensor_model_parallel_size
        kv_claim = "trtllm KV cache (gpu_memory_utilization)"
        generate[kv_claim] = int(rollout.gpu_memory_utilization * max(0, (capacity or 0) - sum(resident.values())))
        if not rollout.free_cache_engine:
            resident[kv_claim] = generate.pop(kv_claim)
    elif name == "hf":  # other engines (a remote server, the user's own) hold nothing the estimate knows of
        gen_rows = _generate_rows(config, plan)
        decoding = min(rollout.micro_batch_size or gen_rows, gen_rows)
        e = DTYPE_BYTES[plan.hf_engine_dtype]  # its copy of the model: float32 on CPU, rollout.dtype on CUDA
        generate["hf engine weights"] = e * actor.parameters
        if plan.hf_static_decode:
            # One preallocated cache of the bucketed prompt and the whole response.
            bucketed = -(-prompt // STATIC_PROMPT_BUCKET) * STATIC_PROMPT_BUCKET
            generate["KV cache"] = decoding * 2 * actor.kv_dim * (bucketed + response) * e * actor.layers
        else:  # the cache grows by concatenation: the step's new tensors of a layer exist beside the old ones
            generate["KV cache"] = decoding * 2 * actor.kv_dim * length * e * (actor.layers + 1)
        generate["prefill"] = (
            decoding * prompt * (2 * e * actor.hidden + actor.layer_temporaries(e))
            + decoding * actor.vocab * FLOAT32_BYTES * SAMPLING_COPIES  # the sampler's float32 logits
        )
        # The static loop's compiled CUDA graphs read the weights and the cache where they were captured: both stay
        # all step, and so does the graph's private memory pool, which holds its step's sampling temporaries.
        if cuda and plan.hf_static_decode:
            resident["hf engine weights"] = generate.pop("hf engine weights")
            resident["KV cache"] = generate.pop("KV cache")
            resident["decode graph pool"] = decoding * actor.vocab * FLOAT32_BYTES * SAMPLING_COPIES
        elif not rollout.free_cache_engine:
            resident["hf engine weights"] = generate.pop("hf engine weights")

    phases = {"generate": {**resident, **generate}}

    # ---- the actor's passes
    checkpointing = bool(model_cfg.enable_gradient_checkpointing)
    actor_c = DTYPE_BYTES[plan.compute_dtype]
    if "actor_log_prob" in passes:
        sum_pi_squared = 2 if actor_cfg.calculate_sum_pi_squared else 0
        old = _Pass(actor, actor_fsdp, actor_c, sequences("actor_log_prob"), checkpointing, actor_bytes, actor_shard,
                    plan.sequence_parallel)
        phases["old_log_prob"] = {
            **resident,
            **forward_parts(old, grad=False, entropy=True, extra_copies=sum_pi_squared),
        }
    if "ref_log_prob" in passes:
        ref_fsdp = actor_fsdp if lora is not None else arr.ref.fsdp_config
        ref_c = actor_c if lora is not None else DTYPE_BYTES[plan.ref_compute_dtype]
        ref = _Pass(actor, ref_fsdp, ref_c, sequences("ref_log_prob"), checkpointing,
                    actor_bytes if lora is not None else ref_bytes, actor_shard, plan.sequence_parallel)
        phases["ref"] = {**resident, **forward_parts(ref, grad=False, entropy=False)}

    # ---- the critic's passes (its own process on the same rank)
    if plan.use_critic:
        critic_c = DTYPE_BYTES[plan.critic_compute_dtype]
        critic_checkpointing = bool(config.critic.model.enable_gradient_checkpointing)
        critic_sp = plan.critic_sequence_parallel
        values = _Pass(critic_shape, critic_fsdp, critic_c, sequences("critic_forward"), critic_checkpointing,
                       critic_bytes, critic_shard, critic_sp)
        train = _Pass(critic_shape, critic_fsdp, critic_c, sequences("critic_update"), critic_checkpointing,
                      critic_bytes, critic_shard, critic_sp, accumulates("critic_update"))
        phases["values"] = {**resident, **forward_parts(values, grad=False, entropy=False)}
        critic_host = params_in_host_memory(plan.device, critic_fsdp)
        phases["update_critic"] = {
            **resident,
            "critic optimizer": 0 if critic_host else critic_optimizer,
            **update_parts(train, entropy=False),
        }

    # ---- the actor's update: forward and backward of a micro-batch, then the optimizer step
    train = _Pass(actor, actor_fsdp, actor_c, sequences("actor_update"), checkpointing, actor_bytes, actor_shard,
                  plan.sequence_parallel, accumulates("actor_update"))
    update = update_parts(train, entropy=plan.update_needs_entropy)
    # With the parameters in host memory the optimizer steps there: its state, the gradients and the step's
    # temporaries never reach the device.
    actor_host = params_in_host_memory(plan.device, actor_fsdp)
    phases["update_actor"] = {**resident, "actor optimizer": 0 if actor_host else actor_optimizer, **update}
    phases["optimizer_step"] = dict(resident)
    if not actor_host:
        phases["optimizer_step"].update({
            "actor optimizer": actor_optimizer,
            # Float32MasterAdamW turns each gradient into a float32 one for its masters.
            "gradients": FLOAT32_BYTES * actor.trainable // actor_shard,
        })
        # AdamW's foreach step makes one temporary per moment tensor (the denominator); the fused one none.
        if not adamw_is_fused(plan.device):
            phases["optimizer_step"]["optimizer temporaries"] = FLOAT32_BYTES * actor.trainable // actor_shard
    return MemoryEstimate(phases, capacity, capacity_source, plan.device)


# ------------------------------------------------------------------------------------------------ the sizing
def _sizes_to_try(micro: MicroBatches, share: int, length: int) -> list[int]:
    """The sizes an unset micro-batch may take, largest first: the divisors of its share (so every micro-batch is
    whole) holding at most its token cap of `length`-token sequences, or 1 when even one sequence is longer."""
    most = share if micro.token_cap is None else max(1, micro.token_cap // length)
    return [d for d in range(min(share, most), 0, -1) if share % d == 0]


def size_micro_batches(
    config: DictConfig,
    plan: RunPlan,
    shapes: dict[str, ModelShape] | None,
    capacity: int | None,
) -> RunPlan:
    """The plan with each micro-batch size the config leaves unset (and no use_dynamic_bsz replaces) chosen: the
    largest divisor of the pass's share that holds at most the pass's token budget of full-length sequences (its
    `*_max_token_len_per_gpu`, as verl's dynamic micro-batches would; `MicroBatches.token_cap`) and whose phase fits
    WARN_SHARE x `capacity` bytes, or 1 when none does (the check's refusal then names what else can change). A
    phase is what the rank holds plus that one pass's temporaries, so each pass is sized on its own. Without
    `shapes` (no estimate: memory_check=off, or a model whose shape cannot be read) the token budget alone sizes it.
    The actor's log-prob pass is sized even where the step skips it: a reward manager that scores with the actor
    runs it. `sized_by_memory` lists the sizes chosen.

    Why a token cap: past a few thousand tokens a forward is compute-bound, so a larger micro-batch buys no speed
    but holds more logits (the H200 run of 2026-11-28 sized the 0.5B job's update to its whole mini-batch of 128
    sequences and allocated 112 GiB where TRL took 64)."""
    by_memory = shapes is not None and capacity is not None
    length = _sequence_length(config)
    source = plan.old_log_prob_source
    plan = dataclasses.replace(plan, old_log_prob_source="recompute")
    sized = []
    for field, (micro, share) in _planned_passes(plan).items():
        if micro.size is not None or micro.dynamic:
            continue
        for size in _sizes_to_try(micro, share, length):
            candidate = _with_micro(plan, field, dataclasses.replace(micro, size=size))
            if not by_memory:
                break
            estimate = estimate_ppo_memory(config, candidate, shapes, capacity)
            if estimate.total(PASS_PHASES[field]) <= WARN_SHARE * capacity:
                break
        plan = candidate  # the last one tried: the one that fits, else 1
        sized.append((micro.key, size))
    return dataclasses.replace(plan, old_log_prob_source=source, sized_by_memory=plan.sized_by_memory + tuple(sized))


def _capped_sizes(config: DictConfig, plan: RunPlan) -> str:
    """The token budgets that capped a size the estimate chose, for the log: "cap_key=N, ..."."""
    length, capped = _sequence_length(config), []
    for micro, share in _planned_passes(plan).values():
        if micro.token_cap is not None and micro.token_cap // length < share and micro.size is not None:
            if micro.size == _sizes_to_try(micro, share, length)[0]:
                capped.append(f"{micro.cap_key}={micro.token_cap}")
    return ", ".join(capped)


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
    lora_rank, _, lora_targets = lora_settings(model) or (0, 0.0, model.target_modules)
    shapes = {
        "actor": read_model_shape(
            model.path,
            "lm",
            lora_rank,
            lora_targets,
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
    if config.reward_model.enable and served_reward_engine(config.reward_model) is None:
        shapes["reward_model"] = read_model_shape(
            config.reward_model.model.path, "sequence", trust_remote_code=config.reward_model.model.trust_remote_code
        )
    return shapes


def _remedies(plan: RunPlan) -> list[tuple[str, str]]:
    """The keys that shrink the run, in the order they are suggested: (key, kind); "size" keys are searched for the
    largest value that fits, "flag" keys tried switched on, "bf16" keys (a model_dtype) tried at bf16, "sp" keys
    (a Ulysses group size) searched for the smallest that fits, "down" keys (floats) searched for the largest value
    that fits. A micro-batch the estimate sized is left out: it is already the largest that fits, or 1."""
    sized = dict(plan.sized_by_memory)
    keys = []
    for micro, _ in _planned_passes(plan).values():
        if micro.dynamic or micro.key not in sized:  # a token budget's key, or a size the user chose
            keys.append((micro.key, "size"))
    keys.append(("actor_rollout_ref.model.enable_gradient_checkpointing", "flag"))
    if plan.use_critic:
        keys.append(("critic.model.enable_gradient_checkpointing", "flag"))
    keys.append(("actor_rollout_ref.model.use_fused_kernels", "flag"))
    if plan.n_ranks > 1:
        keys.append(("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "sp"))
    keys.append(("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "flag"))
    if plan.use_reference_policy:
        keys.append(("actor_rollout_ref.ref.fsdp_config.model_dtype", "bf16"))
    if plan.rollout_engine == "hf":
        keys += [
            ("actor_rollout_ref.rollout.free_cache_engine", "flag"),
            ("actor_rollout_ref.rollout.micro_batch_size", "size"),
        ]
    if plan.device == "cuda":
        if plan.rollout_engine in ("vllm", "sglang"):
            keys += [
                ("actor_rollout_ref.rollout.free_cache_engine", "flag"),
                ("actor_rollout_ref.rollout.gpu_memory_utilization", "down"),
            ]
        keys += [
            ("actor_rollout_ref.model.enable_activation_offload", "flag"),
            ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "flag"),
            ("actor_rollout_ref.actor.fsdp_config.param_offload", "flag"),
        ]
        if plan.use_reference_policy:
            keys.append(("actor_rollout_ref.ref.fsdp_config.param_offload", "flag"))
        if plan.use_critic:
            keys += [
                ("critic.model.fsdp_config.optimizer_offload", "flag"),
                ("critic.model.fsdp_config.param_offload", "flag"),
            ]
    keys.append(("actor_rollout_ref.rollout.n", "size"))
    return keys


def suggest_fixes(config: DictConfig, plan: RunPlan, estimate_with, capacity: int, current_peak: int) -> list[str]:
    """Single-key changes, each re-estimated (`estimate_with(changed_config)` -> MemoryEstimate, the changed config
    planned and its unset micro-batches sized as the run would): the largest value of a size key (or the switch)
    that fits, else what it saves."""
    fixes = []
    for key, kind in _remedies(plan):
        value = OmegaConf.select(config, key)
        if kind in ("flag", "bf16"):
            wanted = True if kind == "flag" else "bf16"
            if value is True or value in ("bf16", "bfloat16"):
                continue
            peak = _peak_with(config, estimate_with, key, wanted)
            if peak < current_peak:
                verdict = "fits" if peak <= capacity else f"saves {gib(current_peak - peak)}, not enough alone"
                fixes.append(f"{key}={'true' if wanted is True else wanted}: peak {gib(peak)} ({verdict})")
            continue
        if kind == "sp":
            candidates = [size for size in (2, 4, 8, 16) if size > value and plan.n_ranks % size == 0]
            for candidate in candidates:
                try:
                    peak = _peak_with(config, estimate_with, key, candidate)
                except ConfigError:  # the batch sizes do not split over that many groups
                    continue
                if peak < current_peak:
                    verdict = "fits" if peak <= capacity else f"saves {gib(current_peak - peak)}, not enough alone"
                    fixes.append(f"{key}={candidate} (now {value}): peak {gib(peak)} ({verdict})")
                    if peak <= capacity:
                        break
            continue
        if kind == "down":
            top = value
            candidates = [round(value * k / 20, 2) for k in range(19, 0, -1)]
        else:
            top = value or _current_size(config, plan, key)
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


def _current_size(config: DictConfig, plan: RunPlan, key: str) -> int | None:
    """What an unset size key means, for the search: the planned micro-batch (or the whole share of its pass), or
    the sequences the HF engine decodes at once."""
    if key == "actor_rollout_ref.rollout.micro_batch_size":
        return _generate_rows(config, plan)
    for micro, share in _planned_passes(plan).values():
        if micro.key == key:
            return micro.size or share
    return None


def _peak_with(config: DictConfig, estimate_with, key: str, value) -> int:
    changed = copy.deepcopy(config)
    with open_dict(changed):
        OmegaConf.update(changed, key, value, force_add=True)
    return estimate_with(changed).peak


def check_ppo_memory(
    config: DictConfig,
    plan: RunPlan,
    shapes: dict[str, ModelShape] | None = None,
    *,
    replan: Callable[[DictConfig], RunPlan],
) -> tuple[RunPlan, MemoryEstimate | None]:
    """Size the micro-batches the config leaves unset from the per-rank estimate (`size_micro_batches`), print the
    estimate and, per `trainer.memory_check`, refuse (ConfigError) or warn when its peak does not fit the capacity
    (`trainer.memory_per_rank_gb`, else the device's). Returns (the plan to run, the estimate); with
    memory_check=off, or when the models' shapes cannot be read (the workers then report the model's problem
    themselves), (the plan unchanged, None). `replan(config)` is the plan of a changed config (the run plan's maker,
    verl/trainer/ppo/run_plan.py `plan_run`, for this device and model): each suggested change is re-planned and
    re-estimated."""
    trainer = config.trainer
    mode = trainer.memory_check
    if mode == "off":
        return size_micro_batches(config, plan, None, None), None
    if shapes is None:
        try:
            shapes = ppo_model_shapes(config, plan.use_critic)
        except Exception as err:  # a broken or unusual model directory: loading it will say what is wrong
            print(f"[memory] no estimate: cannot build the model's shape ({type(err).__name__}: {err})")
            return size_micro_batches(config, plan, None, None), None
    if trainer.memory_per_rank_gb is not None:
        capacity, source = int(trainer.memory_per_rank_gb * GIB), "trainer.memory_per_rank_gb"
    else:
        capacity, source = device_capacity(plan.device, plan.ranks_per_node)

    def sized_estimate(cfg: DictConfig, cfg_plan: RunPlan) -> tuple[RunPlan, MemoryEstimate]:
        sized = size_micro_batches(cfg, cfg_plan, shapes, capacity)
        return sized, estimate_ppo_memory(cfg, sized, shapes, capacity, source)

    def replanned(changed: DictConfig) -> MemoryEstimate:
        return sized_estimate(changed, replan(changed))[1]

    plan, estimate = sized_estimate(config, plan)
    if plan.sized_by_memory:
        capped = _capped_sizes(config, plan)
        print("[memory] sized by the estimate: " + ", ".join(f"{key}={n}" for key, n in plan.sized_by_memory)
              + (f" (capped by the token budgets {capped})" if capped else ""))
    print(estimate.summary())
    if estimate.peak <= WARN_SHARE * capacity:
        return plan, estimate
    if estimate.fits():
        print(
            f"[memory] warning: the estimated peak is {estimate.peak / capacity:.0%} of the capacity; little "
            "room is left for what the estimate leaves out (the allocator's caches, fragmentation)"
        )
        return plan, estimate
    fixes = suggest_fixes(config, plan, replanned, capacity, estimate.peak)
    # The peak phase's micro-batch, when the sizing already took it down to one sequence.
    phase_keys = {micro.key: PASS_PHASES[field] for field, (micro, _) in _planned_passes(plan).items()}
    at_one = next(
        (key for key, n in plan.sized_by_memory if n == 1 and phase_keys.get(key) == estimate.peak_phase), None
    )
    message = (
        f"the run needs about {gib(estimate.peak)} per rank in {estimate.peak_phase}, more than the "
        f"{gib(capacity)} a rank has ({source}): {estimate.phase_line(estimate.peak_phase, aligned=False)}.\n"
        + (
            f"That is at one sequence per micro-batch ({at_one} was unset; the estimate sized it to 1): a "
            "smaller micro-batch cannot help.\n"
            if at_one
            else ""
        )
        + "Single changes, each re-estimated (unset micro-batches sized again):\n  "
        + (
            "\n  ".join(fixes)
            if fixes
            else "none of these keys helps: use more ranks (trainer.n_gpus_per_node, trainer.nnodes) or a smaller model"
        )
        + "\nOr set trainer.memory_check=warn to start anyway (the estimate assumes every prompt and "
        "response at its maximum length)."
    )
    if mode == "warn":
        print(f"[memory] warning: {message}")
        return plan, estimate
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
