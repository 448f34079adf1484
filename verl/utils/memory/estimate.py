"""How much memory one rank of a PPO run needs, estimated before Ray starts from the run plan
(verl/trainer/ppo/run_plan.py), the config's memory settings and the models' config.json (verl/utils/memory/shapes.py).

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
    rollout engine   what the plan's engine claims (`memory_claim` of its class, verl/workers/rollout/). hf: e P (its
                     own copy in hf_engine_dtype: e = 4 on CPU, rollout.dtype's on CUDA; freed or moved to host
                     between rollouts with free_cache_engine) + KV cache 2 L kv (prompt + response) e per sequence it
                     decodes (the rank's prompts x n, the node's with share_cpu_engine; the static loop: the prompt
                     bucketed to 64 tokens, and on CUDA, whose graphs read them where they were captured, the copy and
                     the cache kept all step, and the graphs' pool of the step's sampling temporaries, SAMPLING_COPIES
                     V 4 per sequence); vllm and sglang on CUDA: gpu_memory_utilization of the GPU; trtllm on CUDA:
                     its weights in rollout.dtype all run + gpu_memory_utilization of the memory left free for its KV
                     cache; vllm on CPU: 4 P + 2 V h 4 (its CPU backend packs a copy of the input embedding and of the
                     LM head for its matmuls, tied or not) + its KV cache (no sleep mode there); other engines
                     (openai: a remote server; the user's own): nothing counted unless they claim it
    reward server    a served generative reward model on CUDA: reward_model.rollout.gpu_memory_utilization of the
                     GPU, all run
    process          PROCESS_BYTES per worker process (CUDA context, or on CPU the interpreter with torch), on a CPU
                     with VLLM_CPU_RUNTIME_BYTES more in the one that runs vLLM (the engine's process_bytes)

The phases are the step's that the plan runs (verl/utils/phases.py): generate, old_log_prob
(old_log_prob_source=recompute), ref (a reference policy), values and update_critic (a critic), update_actor,
optimizer_step. A phase adds its own temporaries to what every process of the rank holds at that time, and the peak
is the largest phase. Each phase is one function below.

A micro-batch holds the plan's size of sequences, with use_dynamic_bsz as many full-length sequences as its token
budget holds, and the whole share (the mini-batch of an update, the rank's rows of a forward pass) when unset; the
sizes a config leaves unset are chosen from this estimate (verl/utils/memory/sizing.py).
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from verl.utils.fsdp_utils import (
    adamw_is_fused,
    offloads_optimizer_state,
    params_in_host_memory,
    reshards_after_forward,
)
from verl.utils.fused_logprobs import CHUNK_TOKENS
from verl.utils.memory.claim import EngineClaim, EngineClaimFn, EngineContext
from verl.utils.memory.passes import generate_rows, micro_batch_sequences, planned_passes, sequence_length
from verl.utils.memory.shapes import TEACHER_SHAPE, ModelShape
from verl.utils.memory.units import DTYPE_BYTES, FLOAT32_BYTES, gib
from verl.utils.phases import Phase
from verl.utils.run_plan import MicroBatches, RunPlan
from verl.utils.torch_functional import LOGITS_CHUNK

ADAM_BYTES = 8  # AdamW's exp_avg and exp_avg_sq in float32
# A worker process before its models: on CPU the interpreter with torch and transformers; on CUDA its context
# (measured: benchmarks/README.md, "Memory estimate: measurements behind the constants", as for the figures below).
PROCESS_BYTES = 512 * 1024**2
# Float32 copies of the (response tokens x vocabulary) logits alive at the peak of logprobs_and_entropy and its
# backward (verl/utils/torch_functional.py), by (gradient, entropy): the logits, logits / T and the log-softmax (its
# gradient replaces logits / T in the backward); the entropy adds the softmax, its product with the logits and their
# gradients.
LOGITS_COPIES = {(False, False): 3, (False, True): 4, (True, False): 3, (True, True): 8}
# With entropy_from_logits_with_chunking, by entropy: float32 copies of one chunk's (LOGITS_CHUNK positions x
# vocabulary) logits alive at once (its float32 copy, log-softmax, softmax, their gradients), on top of the whole
# micro-batch's logits and their gradient (2 copies), which the LM head makes before any chunk.
CHUNKED_LOGITS_COPIES = {False: 2, True: 7}
# The fused log-probs (model.use_fused_kernels): float32 (FUSED_CHUNK, vocabulary) tensors alive at once in a chunk
# of the forward or of its recomputing backward (the logits, their softmax, the gradient).
FUSED_LOGITS_COPIES = 3


@dataclasses.dataclass
class MemoryEstimate:
    """Bytes per rank, phase by phase: {phase: {part: bytes}}; `capacity` bytes per rank (None: unknown)."""

    phases: dict[str, dict[str, int]]
    capacity: int | None
    capacity_source: str
    device: str
    engine_levers: tuple[tuple[str, str], ...] = ()  # the rollout engine's (EngineClaim.levers)

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


# ------------------------------------------------------------------------------------------------ the passes
@dataclasses.dataclass(frozen=True)
class _Step:
    """What every phase reads: the config's memory settings and lengths, the plan, the models' shapes and the plan's
    micro-batched passes (`planned_passes`)."""

    config: DictConfig
    plan: RunPlan
    shapes: dict[str, ModelShape]
    passes: dict[str, tuple[MicroBatches, int]]

    @property
    def cuda(self) -> bool:
        return self.plan.device == "cuda"

    @property
    def length(self) -> int:
        return sequence_length(self.config)

    def sequences(self, field: str) -> int:
        return micro_batch_sequences(*self.passes[field], self.length)

    def accumulates(self, field: str) -> bool:
        """Whether the update's mini-batch takes more than one micro-batch (gradients then accumulate)."""
        return self.sequences(field) < self.passes[field][1]


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


def _actor_pass(step: _Step, field: str) -> _Pass:
    plan, arr = step.plan, step.config.actor_rollout_ref
    return _Pass(step.shapes["actor"], arr.actor.fsdp_config, DTYPE_BYTES[plan.actor.compute_dtype], step.sequences(field),
                 bool(arr.model.enable_gradient_checkpointing), DTYPE_BYTES[plan.actor.param_dtype],
                 plan.actor.fsdp_size, plan.actor.sequence_parallel, field.endswith("_update") and step.accumulates(field))


def _critic_pass(step: _Step, field: str) -> _Pass:
    plan, model = step.plan, step.config.critic.model
    return _Pass(step.shapes["critic"], model.fsdp_config, DTYPE_BYTES[plan.critic.compute_dtype],
                 step.sequences(field), bool(model.enable_gradient_checkpointing), DTYPE_BYTES[plan.critic.param_dtype],
                 plan.critic.fsdp_size, plan.critic.sequence_parallel,
                 field.endswith("_update") and step.accumulates(field))


def _weights(device: str, shape: ModelShape, fsdp, param_bytes: int, shard: int) -> int:
    return 0 if params_in_host_memory(device, fsdp) else param_bytes * shape.parameters // shard


def _optimizer(shape: ModelShape, param_bytes: int, shard: int) -> int:
    """AdamW's moments, and the float32 masters of parameters held in a lower precision."""
    return (ADAM_BYTES + (FLOAT32_BYTES if param_bytes < FLOAT32_BYTES else 0)) * shape.trainable // shard


def _optimizer_between_updates(device: str, fsdp, size: int) -> int:
    """The optimizer's state on the device between updates: not with optimizer_offload (the workers' own rule,
    `offloads_optimizer_state`), nor with the parameters in host memory (FSDP2 then steps the optimizer there, its
    state never on the device). Offloading is a CUDA feature: on CPU everything is in host memory."""
    offloaded = offloads_optimizer_state(device, fsdp) or params_in_host_memory(device, fsdp)
    return 0 if offloaded else size


def _gathered(device: str, p: _Pass) -> int:
    if p.shard == 1 and p.compute_bytes == p.param_bytes:
        return 0
    reshard = reshards_after_forward(device, p.fsdp)
    layers = p.shape.root_parameters + 2 * p.shape.layer_parameters if reshard else p.shape.parameters
    return p.compute_bytes * layers


def _pass_parts(step: _Step, p: _Pass, grad: bool, entropy: bool, extra_copies: float = 0):
    """A pass's temporaries besides its peak: the gathered weights and what it keeps per token; and its two candidate
    peaks, the head's logits (bytes) and the largest layer temporaries (name, bytes)."""
    shape, c, plan = p.shape, p.compute_bytes, step.plan
    length, response = step.length, step.config.data.max_response_length
    tokens, scored = -(-p.sequences * length // p.sp), -(-p.sequences * response // p.sp)
    parts = {"gathered weights": _gathered(plan.device, p)}
    head_bytes = c if step.cuda else 0  # the compute-dtype logits the head makes on CUDA
    logits = 0
    if shape.vocab and plan.actor.fused_logprobs and not extra_copies:  # a chunk of tokens at a time (no full logits)
        logits = int(min(scored, CHUNK_TOKENS) * shape.vocab * FLOAT32_BYTES * FUSED_LOGITS_COPIES)
    elif shape.vocab and grad and step.config.actor_rollout_ref.actor.entropy_from_logits_with_chunking:
        chunk = min(scored, LOGITS_CHUNK)
        copies = scored * (2 + extra_copies) + chunk * CHUNKED_LOGITS_COPIES[entropy]
        logits = int(shape.vocab * FLOAT32_BYTES * copies + scored * shape.vocab * head_bytes)
    elif shape.vocab:
        copies = LOGITS_COPIES[(grad, entropy)]
        logits = int(scored * shape.vocab * (FLOAT32_BYTES * (copies + extra_copies) + head_bytes))
    layer = tokens * shape.layer_temporaries(c)
    # With activation offload (CUDA) what autograd saves waits in host memory: one layer's is on the device.
    saved_layers = 1 if plan.actor.activation_offload and shape.vocab else shape.layers
    if not grad:  # the residual stream, then one layer's temporaries at a time, then the head
        parts["hidden states"] = tokens * 2 * c * shape.hidden
        return parts, logits, ("layer temporaries", layer)
    if p.checkpointing:  # each layer's input; then the head, or one layer recomputed for its backward
        parts["activations"] = tokens * saved_layers * c * shape.hidden
        return parts, logits, ("recomputed layer", tokens * shape.saved_per_token(c) + layer)
    # every layer's activations; then the head, or one layer's gradient temporaries
    parts["activations"] = tokens * saved_layers * shape.saved_per_token(c)
    return parts, logits, ("layer gradients", layer)


def _forward_parts(step: _Step, p: _Pass, grad: bool, entropy: bool, extra_copies: float = 0) -> dict[str, int]:
    """A pass's temporaries: the gathered weights, the activations and the logits of one micro-batch."""
    parts, logits, (name, layer) = _pass_parts(step, p, grad, entropy, extra_copies)
    parts.update({"logits": logits} if logits >= layer else {name: layer})
    return parts


def _update_parts(step: _Step, p: _Pass, entropy: bool) -> dict[str, int]:
    """A micro-batch's forward and backward. The backward starts at the head: the logits' peak comes before any
    layer's gradient exists -- only the head's own, with the fused log-probs, which accumulate it chunk by chunk (the
    plain head computes it after the logits' gradient) --, and every gradient exists only at its end, when the logits
    are gone. The peak is the larger of the two moments."""
    c, shape, fused = p.compute_bytes, p.shape, step.plan.actor.fused_logprobs
    # FSDP2 reduces each layer's unsharded gradient as it is made; the root group's (embeddings, head) stays unsharded
    # until the end of the backward. One float32 rank holds its whole gradients (no gathering).
    unsharded = shape.trainable == shape.parameters and (p.shard > 1 or c != p.param_bytes)
    root_grad = c * shape.root_parameters if unsharded else 0
    gradients = p.param_bytes * shape.trainable // p.shard + root_grad
    head_grad = 0
    if fused and shape.vocab and shape.trainable == shape.parameters:
        head_grad = root_grad or p.param_bytes * shape.root_parameters
    # After the first micro-batch of a mini-batch the earlier ones' (reduced, sharded) gradients are there too.
    held = p.param_bytes * shape.trainable // p.shard if p.accumulates else 0
    parts, logits, (name, layer) = _pass_parts(step, p, grad=True, entropy=entropy)
    # The plain head tied to the input embedding (tie_word_embeddings) gets its gradient twice: autograd holds the
    # head's part until the embedding's own arrives at the very end of the backward, then sums the two: two more
    # copies of the embedding's gradient beside all the others, when the layers' activations and gathered weights
    # are gone. Not with the fused head, whose update stays within its logits' peak.
    end = {}
    if shape.tied_embedding and shape.trainable == shape.parameters and not fused:
        end = {"gradients": gradients,
               "tied embedding gradients": 2 * (c if unsharded else p.param_bytes) * shape.tied_embedding}
        if parts["gathered weights"]:  # the root group stays gathered to its end
            end["gathered weights"] = min(parts["gathered weights"], c * shape.root_parameters)
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


# ------------------------------------------------------------------------------------------------ the phases
def _resident(step: _Step, capacity: int | None) -> dict[str, int]:
    """What each process of the rank holds between its calls, before the rollout engine."""
    plan, config, device = step.plan, step.config, step.plan.device
    arr, actor = config.actor_rollout_ref, step.shapes["actor"]
    actor_bytes, shard = DTYPE_BYTES[plan.actor.param_dtype], plan.actor.fsdp_size
    resident = {
        "actor weights": _weights(device, actor, arr.actor.fsdp_config, actor_bytes, shard),
        "actor optimizer": _optimizer_between_updates(device, arr.actor.fsdp_config,
                                                      _optimizer(actor, actor_bytes, shard)),
    }
    if plan.use_reference_policy and plan.lora is None:
        resident["ref weights"] = _weights(device, actor, arr.ref.fsdp_config, DTYPE_BYTES[plan.ref.param_dtype], shard)
    # distillation's teachers: sharded like the reference, or a whole replica on each rank where a rollout engine
    # serves one (inference.name=hf|vllm)
    engines = {t.name: t.engine for t in (plan.distillation.teachers if plan.distillation is not None else ())}
    for name, shape in step.shapes.items():
        if name.startswith(TEACHER_SHAPE):
            replica = engines.get(name.removeprefix(TEACHER_SHAPE), "fsdp") != "fsdp"
            resident[f"{name} weights"] = _weights(device, shape, arr.ref.fsdp_config, DTYPE_BYTES[plan.ref.param_dtype],
                                                   1 if replica else shard)
    if plan.use_critic:
        critic_shape, critic_fsdp = step.shapes["critic"], config.critic.model.fsdp_config
        critic_bytes, critic_shard = DTYPE_BYTES[plan.critic.param_dtype], plan.critic.fsdp_size
        resident["critic weights"] = _weights(device, critic_shape, critic_fsdp, critic_bytes, critic_shard)
        resident["critic optimizer"] = _optimizer_between_updates(
            device, critic_fsdp, _optimizer(critic_shape, critic_bytes, critic_shard))
    if plan.use_reward_model:
        resident["reward model weights"] = _weights(device, step.shapes["reward_model"],
                                                    config.reward_model.model.fsdp_config, FLOAT32_BYTES,
                                                    plan.reward_model.fsdp_size)
    resident["processes"] = PROCESS_BYTES * plan.processes_per_rank
    if plan.reward_model_server and step.cuda:
        # The served generative reward model shares the first GPUs with the ranks for the whole run: its share of a
        # GPU's memory is taken on the fullest rank's (counted on every rank: the estimate is the fullest's).
        share = config.reward_model.rollout.gpu_memory_utilization
        resident["served reward model (reward_model.rollout.gpu_memory_utilization)"] = int(share * (capacity or 0))
    return resident


def _generate(step: _Step, resident: dict[str, int], engine_claim: EngineClaimFn,
              capacity: int | None) -> tuple[dict[str, int], dict[str, int], EngineClaim]:
    """The rollout engine's claim: (what the rank holds all step with the engine's resident parts, the generate
    phase with its parts for generating too, the claim)."""
    data = step.config.data
    claim = engine_claim(EngineContext(
        rollout=step.config.actor_rollout_ref.rollout, plan=step.plan, actor=step.shapes["actor"],
        capacity=capacity or 0, resident_bytes=sum(resident.values()), rows=generate_rows(step.config, step.plan),
        prompt_length=data.max_prompt_length, response_length=data.max_response_length,
    ))
    resident = {**resident, "processes": resident["processes"] + claim.process_bytes, **claim.resident}
    return resident, {**resident, **claim.generate}, claim


def _old_log_prob(step: _Step, resident: dict[str, int]) -> dict[str, int]:
    sum_pi_squared = 2 if step.config.actor_rollout_ref.actor.calculate_sum_pi_squared else 0
    old = _actor_pass(step, "actor_log_prob")
    return {**resident, **_forward_parts(step, old, grad=False, entropy=True, extra_copies=sum_pi_squared)}


def _ref(step: _Step, resident: dict[str, int]) -> dict[str, int]:
    """The reference's forward: the actor's model, in its own fsdp_config and dtypes (under LoRA the actor itself with
    its adapters off)."""
    arr, plan = step.config.actor_rollout_ref, step.plan
    ref = _actor_pass(step, "ref_log_prob")
    if plan.lora is None:
        ref = dataclasses.replace(ref, fsdp=arr.ref.fsdp_config, compute_bytes=DTYPE_BYTES[plan.ref.compute_dtype],
                                  param_bytes=DTYPE_BYTES[plan.ref.param_dtype])
    return {**resident, **_forward_parts(step, ref, grad=False, entropy=False)}


def _values(step: _Step, resident: dict[str, int]) -> dict[str, int]:
    return {**resident, **_forward_parts(step, _critic_pass(step, "critic_forward"), grad=False, entropy=False)}


def _update_critic(step: _Step, resident: dict[str, int]) -> dict[str, int]:
    train = _critic_pass(step, "critic_update")
    host = params_in_host_memory(step.plan.device, train.fsdp)
    optimizer = 0 if host else _optimizer(train.shape, train.param_bytes, train.shard)
    return {**resident, "critic optimizer": optimizer, **_update_parts(step, train, entropy=False)}


def _update_actor(step: _Step, resident: dict[str, int]) -> dict[str, int]:
    """A micro-batch's forward and backward, with the optimizer's state on the device (unless the parameters are in
    host memory: the optimizer then steps there, its state, the gradients and the step's temporaries never on the
    device)."""
    train = _actor_pass(step, "actor_update")
    host = params_in_host_memory(step.plan.device, train.fsdp)
    optimizer = 0 if host else _optimizer(train.shape, train.param_bytes, train.shard)
    update = _update_parts(step, train, entropy=step.plan.update_needs_entropy)
    return {**resident, "actor optimizer": optimizer, **update}


def _optimizer_step(step: _Step, resident: dict[str, int]) -> dict[str, int]:
    phase = dict(resident)
    train = _actor_pass(step, "actor_update")
    if params_in_host_memory(step.plan.device, train.fsdp):
        return phase
    shard_bytes = FLOAT32_BYTES * train.shape.trainable // train.shard
    # Float32MasterAdamW turns each gradient into a float32 one for its masters.
    phase.update({"actor optimizer": _optimizer(train.shape, train.param_bytes, train.shard), "gradients": shard_bytes})
    # AdamW's foreach step makes one temporary per moment tensor (the denominator); the fused one none.
    if not adamw_is_fused(step.plan.device):
        phase["optimizer temporaries"] = shard_bytes
    return phase


def estimate_ppo_memory(
    config: DictConfig,
    plan: RunPlan,
    shapes: dict[str, ModelShape],
    capacity: int | None = None,
    capacity_source: str = "",
    *,
    engine_claim: EngineClaimFn,
) -> MemoryEstimate:
    """The per-rank estimate of a run: its facts from `plan` (a RunPlan), the memory settings (offload, gradient
    checkpointing, logits chunking, the engine's cache) and lengths from `config`. `shapes`: "actor", and "critic" /
    "reward_model" when the run has them (`ppo_model_shapes`). `engine_claim(EngineContext)`: what the plan's rollout
    engine holds (its class's `memory_claim`; verl/trainer/ppo/memory_check.py looks it up)."""
    step = _Step(config, plan, shapes, planned_passes(plan))
    resident, generate, claim = _generate(step, _resident(step, capacity), engine_claim, capacity)
    phases = {Phase.GENERATE.memory: generate}
    if "actor_log_prob" in step.passes:
        phases[Phase.OLD_LOG_PROB.memory] = _old_log_prob(step, resident)
    if "ref_log_prob" in step.passes:
        phases[Phase.REF.memory] = _ref(step, resident)
    if plan.use_critic:  # its own process on the same rank
        phases[Phase.VALUES.memory] = _values(step, resident)
        phases[Phase.UPDATE_CRITIC.memory] = _update_critic(step, resident)
    phases[Phase.UPDATE_ACTOR.memory] = _update_actor(step, resident)
    phases[Phase.OPTIMIZER_STEP.memory] = _optimizer_step(step, resident)
    return MemoryEstimate(phases, capacity, capacity_source, plan.device, claim.levers)
