"""The data-parallel actor: log-probs and entropy of responses, and the policy update.

One instance lives in each FSDP rank. It sees only that rank's share of the batch; FSDP averages gradients across
ranks. The loss of one mini-batch is accumulated over micro-batches so that its gradient equals the gradient of the
loss aggregated over the whole mini-batch: with token-mean, over the tokens of every rank's share (see
`verl/workers/ppo_batches.py`). What the loss is (policy loss, advantage transforms, KL term) is the actor objective of
`verl/algorithms/losses/base.py`, built from the actor config.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import defaultdict

import torch

from verl.algorithms import build_actor_objective
from verl.algorithms.distillation import combine, distillation_loss, estimator_losses, forward_kl_topk
from verl.algorithms.kl import kl_penalty
from verl.algorithms.primitives import compute_entropy_loss, truncated_is_weights
from verl.protocol import DataProto
from verl.utils.config import option
from verl.utils.exact_kernels import is_exact
from verl.utils.fsdp_utils import clip_grad_and_step, count_skipped_steps, reshard_all
from verl.utils.fused_logprobs import CHUNK_TOKENS, fused_logprobs_and_entropy, lm_head_weight_and_bias
from verl.utils.packing import (
    cut_shared_left_padding,
    pack_rows,
    padded_predictors,
    response_predictors,
    unpack_responses,
    uses_varlen_attention,
)
from verl.utils.rollout_gap import gap_sums, worker_metrics
from verl.utils.run_plan import DistillationPlan, MicroBatches, UpdateBatches
from verl.utils.seqlen_balancing import restore_order, split_micro_batches
from verl.utils.torch_functional import LOGITS_CHUNK, log_probs_of_top_tokens, logprobs_and_entropy, masked_mean
from verl.utils.ulysses import ulysses_forward
from verl.workers.ppo_batches import ppo_mini_batches

ACTOR = "actor_rollout_ref.actor"

FORWARD_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]
# Tokens per chunk of the fused log-probs (model.use_fused_kernels).
FUSED_CHUNK = CHUNK_TOKENS


def _to_responses(values: torch.Tensor, scored: torch.Tensor | None, responses: torch.Tensor) -> torch.Tensor:
    """`(bs, response_len, ...)` from per-position `values` `(n, ...)` of `_response_logits`: in place where `scored`
    marks a token (0 elsewhere), or all positions row-major when `scored` is None."""
    if scored is None:
        return values.view(*responses.shape, *values.shape[1:])
    placed = values.new_zeros(*scored.shape, *values.shape[1:])
    placed[scored] = values
    return placed


@contextlib.contextmanager
def lm_head_on_rows(model: torch.nn.Module, positions: torch.Tensor):
    """Within the block, the model's LM head (its output embeddings) is applied to the hidden states of the flat
    `positions` of `(rows, width)` only, as one row `(1, len(positions), vocab)`; yields whether it could be (a
    model without `get_output_embeddings` computes all logits)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        yield False
        return

    def select(module, args, kwargs):
        hidden = args[0] if args else kwargs.pop("input")
        picked = hidden.reshape(-1, hidden.shape[-1])[positions].unsqueeze(0)
        return (picked, *args[1:]), kwargs

    handle = head.register_forward_pre_hook(select, with_kwargs=True)
    try:
        yield True
    finally:
        handle.remove()


def _kept(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@contextlib.contextmanager
def offloaded_activations(enabled: bool, model: torch.nn.Module):
    """model.enable_activation_offload: within the block, what autograd saves for the backward pass of the model's
    decoder layers goes to pinned host memory and comes back when the backward pass needs it (torch's
    `save_on_cpu`); with (non-reentrant) gradient checkpointing that is each layer's input. From the LM head on,
    what is saved stays on the device, as in verl, which offloads the decoder layers' activations: the head's
    gathered weight and the float32 logits and log-softmax would otherwise cross to the host and back every
    micro-batch (at the 0.5B shape, 8 x 256 response tokens: 0.27 GB of bf16 weight and 1.2 GB per float32 copy of
    the logits), and the memory estimate counts the logits on the device. Off: nothing changes."""
    if not enabled:
        yield
        return
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    with contextlib.ExitStack() as on_device, torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
        entered = []

        def keep_on_device(module, args):
            # Innermost saved-tensor hooks win: from here to the end of the block nothing more is offloaded.
            if not entered:
                entered.append(on_device.enter_context(torch.autograd.graph.saved_tensors_hooks(_kept, _kept)))

        handle = head.register_forward_pre_hook(keep_on_device) if head is not None else None
        try:
            yield
        finally:
            if handle is not None:
                handle.remove()
            on_device.close()  # before save_on_cpu exits: the hooks stack is last in, first out


@contextlib.contextmanager
def fused_lm_head(model: torch.nn.Module, positions: torch.Tensor, labels: torch.Tensor, temperature: float,
                  with_entropy: bool):
    """Within the block, the model's LM head returns, instead of logits, log p(label) and the entropy of the flat
    `positions` of its input `(rows, width, hidden)`, computed from the hidden states and the head's weight a chunk
    of FUSED_CHUNK tokens at a time (`verl/utils/fused_logprobs.py`): `(1, len(positions), 2)` (log-prob, entropy)
    or `(1, len(positions), 1)`. The head's own forward never runs, so the `(tokens, vocab)` logits never exist.
    Inside the model's forward FSDP2 has gathered the head's weight; its gradient flows as through the head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise ValueError(f"{type(model).__name__} has no get_output_embeddings(): model.use_fused_kernels needs the "
                         "LM head; set actor_rollout_ref.model.use_fused_kernels=false")
    hf_config = getattr(model, "config", None)
    if getattr(hf_config, "final_logit_softcapping", None):
        raise ValueError("model.use_fused_kernels: this model caps its logits (final_logit_softcapping), which the "
                         "fused log-probs do not apply; set actor_rollout_ref.model.use_fused_kernels=false")

    exact = is_exact(model)  # rollout.exact: the head's bits, as the unfused head and the engine give them

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        weight, bias = lm_head_weight_and_bias(head)
        rows = hidden.reshape(-1, hidden.shape[-1])[positions]
        log_prob, entropy = fused_logprobs_and_entropy(rows, weight, labels, temperature, bias=bias,
                                                       with_entropy=with_entropy, chunk_size=FUSED_CHUNK, exact=exact)
        columns = (log_prob, entropy) if with_entropy else (log_prob,)
        return torch.stack(columns, dim=-1).unsqueeze(0)

    previous = vars(head).get("forward")  # an instance's own forward (exact mode's linear) comes back after the block
    head.forward = forward
    try:
        yield
    finally:
        if previous is None:
            del head.forward
        else:
            head.forward = previous


class DataParallelPPOActor:
    """Computes log-probs and updates the policy of one FSDP rank.

    `config` is the `actor_rollout_ref.actor` (or `ref`) node as the user wrote it; the sizes of this rank's update
    batches come from the run plan (verl/trainer/ppo/run_plan.py) as `batches`, those of a log-prob pass from its
    `meta_info` (the worker puts the plan's there).
    """

    def __init__(self, config, actor_module: torch.nn.Module, actor_optimizer: torch.optim.Optimizer | None = None,
                 *, use_remove_padding: bool, batches: UpdateBatches | None = None,
                 log_prob: MicroBatches | None = None, fused_logprobs: bool = False, activation_offload: bool = False,
                 sp_group=None, distillation: DistillationPlan | None = None):
        self.config = config
        # On-policy distillation (verl/algorithms/distillation.py): the update adds the distillation term, reading
        # the teachers' log-probs of the batch; None: plain RL.
        self.distillation = distillation
        # Ulysses sequence parallelism: the ranks of `sp_group` hold the same micro-batches and each runs the model
        # on one piece of every row (`_forward_sequence_parallel`); None: whole rows.
        self.sp_group = sp_group
        # The plan's levers: log-probs and entropy from the hidden states in chunks (`fused_lm_head`); the update's
        # saved activations in pinned host memory until its backward pass (CUDA).
        self.fused_logprobs = fused_logprobs
        self.activation_offload = activation_offload
        self.batches = batches  # the plan's UpdateBatches: this rank's mini- and micro-batches (needed to update)
        # The plan's micro-batches of the no-grad log-prob pass (the old log-probs' or the reference's); None: the
        # rank's whole share in one forward.
        self.log_prob = log_prob or MicroBatches(None, None, "log_prob_micro_batch_size_per_gpu")
        self.use_remove_padding = use_remove_padding
        # Log-prob and entropy temporaries for LOGITS_CHUNK positions at a time, and recomputed in the backward.
        self.logits_chunk_size = LOGITS_CHUNK if option(config, "entropy_from_logits_with_chunking", ACTOR) else None
        self.entropy_checkpointing = bool(option(config, "entropy_checkpointing", ACTOR))
        # verl's actor.grad_clip wins over optim.clip_grad when set.
        grad_clip = option(config, "grad_clip", ACTOR)
        self.max_grad_norm = grad_clip if grad_clip is not None else option(config.get("optim"), "clip_grad",
                                                                              f"{ACTOR}.optim")
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        hf_model = actor_module.get_base_model() if hasattr(actor_module, "get_base_model") else actor_module
        # HF models that take `logits_to_keep` apply the LM head to the last positions only.
        self.takes_logits_to_keep = "logits_to_keep" in inspect.signature(type(hf_model).forward).parameters
        # Packed rows: one row under a varlen attention kernel; filler tokens at the end of shorter rows.
        self.varlen_attention = uses_varlen_attention(hf_model.config)
        self.filler_token_id = getattr(hf_model.config, "pad_token_id", None) or 0
        self.skipped_in_row = 0  # optimizer steps skipped in a row, across updates (non-finite gradient norm)

    # ----------------------------------------------------------------------------------------------- forward
    def _forward_micro_batch(self, micro_batch, temperature: float, calculate_entropy: bool,
                             calculate_sum_pi_squared: bool = False):
        """(entropy or None, log_probs, sum_pi_squared or None), each `(batch, response_len)`, at the sampling
        temperature; sum_pi_squared is sum_v softmax(logits / T)_v^2 at each response position.

        Columns that are padding in every row are cut first. With `use_remove_padding` the sequences' real tokens go
        through the model packed into rows whose position ids restart at 0 for each sequence; the model's attention
        keeps the sequences apart (transformers derives a block-diagonal causal mask from such position ids with sdpa
        and eager attention, and varlen kernels with flash-attn), so no compute is spent on padding. Log-probs at
        padded response positions are 0 on that path.
        """
        responses = micro_batch["responses"]
        response_length = responses.shape[-1]
        input_ids, attention_mask, position_ids = cut_shared_left_padding(
            micro_batch["input_ids"], micro_batch["attention_mask"], micro_batch["position_ids"], response_length)
        chunking = {"chunk_size": self.logits_chunk_size, "checkpoint": self.entropy_checkpointing,
                    "with_sum_pi_squared": calculate_sum_pi_squared}
        # The fused head gives log-probs and entropy only; sum_pi_squared needs the whole distribution.
        fused = self.fused_logprobs and not calculate_sum_pi_squared
        if self.sp_group is not None:
            return self._forward_sequence_parallel(input_ids, attention_mask, position_ids, responses, temperature,
                                                   calculate_entropy, chunking, fused)
        if fused and self.use_remove_padding:
            return self._forward_packed_fused(input_ids, attention_mask, position_ids, responses, temperature,
                                              calculate_entropy)
        if fused:
            batch, width = input_ids.shape
            positions = padded_predictors(batch, width, response_length, input_ids.device)
            with fused_lm_head(self.actor_module, positions, responses.reshape(-1), temperature, calculate_entropy):
                stats = self.actor_module(input_ids=input_ids, attention_mask=attention_mask,
                                          position_ids=position_ids, use_cache=False).logits[0]
            stats = stats.float().view(batch, response_length, -1)
            return (stats[..., 1] if calculate_entropy else None), stats[..., 0], None
        logits, labels, scored = self._response_logits(input_ids, attention_mask, position_ids, responses)
        log_probs, entropy, *sum_pi_squared = logprobs_and_entropy(logits, labels, temperature, calculate_entropy,
                                                                   **chunking)
        return (_to_responses(entropy, scored, responses) if calculate_entropy else None,
                _to_responses(log_probs, scored, responses),
                _to_responses(sum_pi_squared[0], scored, responses) if sum_pi_squared else None)

    def _response_logits(self, input_ids, attention_mask, position_ids, responses):
        """The logits of the positions that predict the response tokens: `(logits (n, vocab), labels (n,), scored)`,
        `labels` the tokens they predict, `scored` `(bs, response_len)` marking where each goes (None: every
        position, n = bs x response_len, row-major).

        With `use_remove_padding` the sequences' real tokens go through the model packed into rows by
        `verl/utils/packing.pack_rows` (one row under a varlen attention kernel, flash-attn; else first-fit-decreasing
        rows no longer than the padded batch's, ending in filler tokens) whose position ids restart at 0 for each
        sequence: the model's attention keeps the sequences apart, and the LM head sees only the predicting
        positions. Else the padded rows go through whole; the logits at position t predict token t+1, so the
        response tokens are predicted by the slice before them, and models that can (HF's `logits_to_keep`) apply
        the LM head to those positions only."""
        if self.use_remove_padding:
            packed_ids, packed_positions, destination = pack_rows(input_ids, attention_mask, position_ids,
                                                                  self.filler_token_id, self.varlen_attention)
            scored, predictors = response_predictors(attention_mask, destination, responses.shape[-1])
            with lm_head_on_rows(self.actor_module, predictors) as selected:
                output = self.actor_module(input_ids=packed_ids, position_ids=packed_positions, attention_mask=None,
                                           use_cache=False)
            logits = output.logits[0] if selected else output.logits.flatten(0, 1)[predictors]
            return logits, responses[scored], scored
        response_length = responses.shape[-1]
        keep = {"logits_to_keep": response_length + 1} if self.takes_logits_to_keep else {}
        output = self.actor_module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=False, **keep)
        return output.logits[:, -response_length - 1 : -1, :].flatten(0, 1), responses.reshape(-1), None

    def _forward_packed_fused(self, input_ids, attention_mask, position_ids, responses, temperature,
                              calculate_entropy):
        """The packed forward pass of `_response_logits` with `fused_lm_head` turning the predicting positions'
        hidden states into log-probs and entropy directly (no logits)."""
        packed_ids, packed_positions, destination = pack_rows(input_ids, attention_mask, position_ids,
                                                              self.filler_token_id, self.varlen_attention)
        scored, predictors = response_predictors(attention_mask, destination, responses.shape[-1])
        with fused_lm_head(self.actor_module, predictors, responses[scored], temperature, calculate_entropy):
            stats = self.actor_module(input_ids=packed_ids, position_ids=packed_positions, attention_mask=None,
                                      use_cache=False).logits[0].float()
        entropy = unpack_responses(stats[:, 1], scored) if calculate_entropy else None
        return entropy, unpack_responses(stats[:, 0], scored), None

    def _forward_topk(self, micro_batch, temperature: float, calculate_entropy: bool = False, *,
                      topk: int | None = None, topk_ids: torch.Tensor | None = None):
        """The forward pass of on-policy distillation's top-k loss: `(entropy or None, log_probs, topk_log_probs,
        topk_ids)`, the first two `(batch, response_len)`, the last two `(batch, response_len, k)`: with `topk`, the
        k most likely tokens of each response position and their log-probs (the teacher's side); with `topk_ids`
        `(batch, response_len, k)`, the log-probs of those tokens (the student's, differentiable). All at
        `temperature`, over the whole vocabulary (no fused head, whole rows)."""
        responses = micro_batch["responses"]
        input_ids, attention_mask, position_ids = cut_shared_left_padding(
            micro_batch["input_ids"], micro_batch["attention_mask"], micro_batch["position_ids"], responses.shape[-1])
        logits, labels, scored = self._response_logits(input_ids, attention_mask, position_ids, responses)
        log_probs, entropy = logprobs_and_entropy(logits, labels, temperature, calculate_entropy)
        ids = None
        if topk_ids is not None:  # the teacher's ids laid out like the positions
            ids = topk_ids.flatten(0, 1) if scored is None else topk_ids[scored]
        topk_log_probs, ids = log_probs_of_top_tokens(logits, temperature, k=topk, ids=ids)
        return (_to_responses(entropy, scored, responses) if calculate_entropy else None,
                _to_responses(log_probs, scored, responses), _to_responses(topk_log_probs, scored, responses),
                _to_responses(ids, scored, responses))

    def _forward_sequence_parallel(self, input_ids, attention_mask, position_ids, responses, temperature,
                                   calculate_entropy, chunking, fused):
        """The forward pass under Ulysses sequence parallelism (`verl/utils/ulysses.py`): the rows (packed with
        use_remove_padding, else padded) are cut along their length into one piece per rank of `sp_group`; each rank
        runs the model on its piece (attention exchanges pieces and heads with all-to-all) and scores the
        positions of its piece that predict response tokens; the per-position statistics are then gathered, whole,
        on every rank. `(entropy or None, log_probs, sum_pi_squared or None)`, each `(batch, response_len)`."""
        response_length = responses.shape[-1]
        if self.use_remove_padding:
            rows, positions, destination = pack_rows(input_ids, attention_mask, position_ids, self.filler_token_id,
                                                     self.varlen_attention)
            scored, predictors = response_predictors(attention_mask, destination, response_length)
            mask, targets = None, responses[scored]
        else:
            rows, positions, mask, scored = input_ids, position_ids, attention_mask, None
            predictors = padded_predictors(*rows.shape, response_length, rows.device)
            targets = responses.reshape(-1)
        # Which positions predict a response token, and that token, laid out like the rows: split like them.
        flags = torch.zeros(rows.numel(), dtype=torch.bool, device=rows.device).index_fill_(0, predictors, True)
        labels = torch.zeros(rows.numel(), dtype=responses.dtype, device=rows.device).index_put_((predictors,),
                                                                                                targets)
        with ulysses_forward(self.actor_module, self.sp_group, rows, mask, positions) as sp:
            local_flags = sp.split(flags.view_as(rows), pad_value=False)
            local = local_flags.flatten().nonzero().squeeze(1)
            local_labels = sp.split(labels.view_as(rows)).flatten()[local]
            if fused:
                with fused_lm_head(self.actor_module, local, local_labels, temperature, calculate_entropy):
                    stats = self.actor_module(**sp.model_inputs, use_cache=False).logits[0].float()
            else:
                with lm_head_on_rows(self.actor_module, local) as selected:
                    output = self.actor_module(**sp.model_inputs, use_cache=False)
                logits = output.logits[0] if selected else output.logits.flatten(0, 1)[local]
                columns = logprobs_and_entropy(logits, local_labels, temperature, calculate_entropy, **chunking)
                stats = torch.stack([c for c in columns if c is not None], dim=-1)
            # This rank's statistics in place in its piece (0 elsewhere), then every piece on every rank.
            placed = stats.new_zeros(local_flags.numel(), stats.shape[-1]).index_put((local,), stats)
            whole = sp.gather(placed.view(*local_flags.shape, -1), dim=1).flatten(0, 1)[predictors]
        if scored is None:
            columns = list(whole.view(len(responses), response_length, -1).unbind(-1))
        else:
            columns = [unpack_responses(column, scored) for column in whole.unbind(-1)]
        log_prob, entropy = columns.pop(0), columns.pop(0) if calculate_entropy else None
        return entropy, log_prob, (columns.pop(0) if columns else None)

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False,
                         calculate_sum_pi_squared: bool = False):
        """Log-probs (and entropy) of `responses` under the current weights; no gradient.

        meta_info: `temperature`. The micro-batches are the plan's (`log_prob`, given at construction).
        Returns `(log_probs, entropys or None)`, each `(batch, response_len)`; with `calculate_sum_pi_squared`,
        `(log_probs, entropys or None, sum_pi_squared)`, sum_pi_squared = sum_v softmax(logits / T)_v^2 at each
        response position (0 on padding with use_remove_padding), which the optimal token baseline needs.
        """
        self.actor_module.eval()
        temperature = data.meta_info["temperature"]
        batch = data.select(batch_keys=FORWARD_KEYS).batch
        micro_batches, index_map = split_micro_batches(batch, self.log_prob.size, self.log_prob.max_token_len)
        parts = [self._forward_micro_batch(micro_batch, temperature, calculate_entropy, calculate_sum_pi_squared)
                 for micro_batch in micro_batches]
        reshard_all(self.actor_module)  # with reshard_after_forward=false, no backward pass would free them

        def gather(column: int, wanted: bool = True) -> torch.Tensor | None:
            return restore_order(torch.cat([part[column] for part in parts]), index_map) if wanted else None

        log_probs, entropys = gather(1), gather(0, calculate_entropy)
        if calculate_sum_pi_squared:
            return log_probs, entropys, gather(2)
        return log_probs, entropys

    @torch.no_grad()
    def compute_topk_log_prob(self, data: DataProto, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(log_probs (bs, response_len), topk_log_probs (bs, response_len, k), topk_ids (bs, response_len, k))`:
        the sampled tokens' log-probs and each response position's k most likely tokens, at
        `meta_info["temperature"]`, in the plan's micro-batches (`_forward_topk`; a distillation teacher's pass)."""
        self.actor_module.eval()
        batch = data.select(batch_keys=FORWARD_KEYS).batch
        micro_batches, index_map = split_micro_batches(batch, self.log_prob.size, self.log_prob.max_token_len)
        parts = [self._forward_topk(micro_batch, data.meta_info["temperature"], topk=k)[1:]
                 for micro_batch in micro_batches]
        reshard_all(self.actor_module)
        return tuple(restore_order(torch.cat(column), index_map) for column in zip(*parts, strict=True))

    # ------------------------------------------------------------------------------------------------ update
    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO update: `ppo_epochs` passes over mini-batches of `ppo_mini_batch_size` sequences.

        Needs `responses`, `response_mask`, `old_log_probs`, `advantages` (and `ref_log_prob` with use_kl_loss);
        `rollout_is_weights` `(bs, response_len)`, when present, goes to the policy loss. Per micro-batch:

            loss = policy_loss(objective.advantages(A)) - entropy_coeff * entropy + objective.kl_loss(kl)

        With distillation (the plan's, `self.distillation`) the batch also holds the teachers' log-probs and the loss
        is `combine(loss, distillation term)` of verl/algorithms/distillation.py.

        Returns metrics as lists (one entry per micro-batch or per optimizer step); `actor/skipped_steps` counts the
        optimizer steps skipped for a non-finite gradient norm, `actor/skipped_steps_in_row` the run of them up to the
        last (the trainer stops at `trainer.max_skipped_steps_in_row`).
        """
        cfg = self.config
        self.actor_module.train()
        temperature = data.meta_info["temperature"]
        objective = build_actor_objective(cfg, data.meta_info)  # meta_info: bypass-mode REINFORCE's settings
        keys = FORWARD_KEYS + ["response_mask", "advantages"]
        if cfg.use_kl_loss:
            keys.append("ref_log_prob")
        has_is_weights = "rollout_is_weights" in data.batch.keys()
        if has_is_weights:
            keys.append("rollout_is_weights")
        # Without old log-probs the update must be on-policy (one epoch, one mini-batch): the old policy is then the
        # current one, and its log-probs are this forward pass's, detached (see old_log_prob_source in run_plan).
        has_old = "old_log_probs" in data.batch.keys()
        # Decoupled PPO with the proximal policy = the weights before this update = this forward pass's (detached):
        # the importance weight proximal / behaviour is made here, per micro-batch (async_plan.py).
        decoupled_c = data.meta_info.get("decoupled_is_threshold")
        in_update_weights = decoupled_c is not None and not has_is_weights and not has_old
        # Where no old-log-prob pass ran (run_plan's old_log_prob_source), the rollout-actor gap is measured here on
        # the first mini-batch, whose forward runs on the weights that sampled it (verl/utils/rollout_gap.py).
        measure_gap = (data.meta_info.get("old_log_prob_source", "recompute") != "recompute"
                       and "rollout_log_probs" in data.batch.keys())
        if in_update_weights or measure_gap:
            keys.append("rollout_log_probs")
        distill = self.distillation
        if distill is not None:
            keys += ["teacher_topk_log_probs", "teacher_topk_ids"] if distill.uses_topk else ["teacher_log_probs"]
        # Without task rewards (distillation_loss.use_task_rewards=false) the loss is the distillation term alone.
        rl_term = distill is None or distill.use_task_rewards
        if has_old:
            keys.append("old_log_probs")
        elif cfg.ppo_epochs != 1 or self.batches is None or len(data) > self.batches.mini_batch:
            mini = self.batches.mini_batch if self.batches is not None else None
            raise ValueError(f"update_policy got no old_log_probs, which only an on-policy update can do without "
                             f"(ppo_epochs=1 and one mini-batch); here ppo_epochs={cfg.ppo_epochs} and {len(data)} "
                             f"sequences per rank in mini-batches of {mini}")
        metrics = defaultdict(list)

        for index, micro_batches in enumerate(ppo_mini_batches(data.select(batch_keys=keys).batch, cfg, self.batches)):
            for micro_batch, weight in micro_batches:
                mask = micro_batch["response_mask"]
                with offloaded_activations(self.activation_offload, self.actor_module):
                    if distill is not None and distill.uses_topk:  # the student at the teacher's top-k tokens
                        entropy, log_prob, student_topk, _ = self._forward_topk(
                            micro_batch, temperature, objective.needs_entropy and rl_term,
                            topk_ids=micro_batch["teacher_topk_ids"])
                    else:
                        entropy, log_prob, _ = self._forward_micro_batch(micro_batch, temperature,
                                                                         objective.needs_entropy and rl_term)
                if measure_gap and index == 0:
                    for name, values in worker_metrics(gap_sums(micro_batch["rollout_log_probs"], log_prob,
                                                                mask)).items():
                        metrics[name].extend(values)
                is_weights = micro_batch["rollout_is_weights"] if has_is_weights else None
                if in_update_weights:
                    is_weights = truncated_is_weights(log_prob, micro_batch["rollout_log_probs"], mask,
                                                      float(decoupled_c))
                    metrics["actor/decoupled_is_weight_mean"].append(masked_mean(is_weights, mask).item())
                old_log_prob = micro_batch["old_log_probs"] if has_old else log_prob.detach()
                loss = None
                if rl_term:
                    loss = self._rl_loss(objective, micro_batch, log_prob, old_log_prob, entropy, is_weights, metrics)
                if distill is not None:
                    loss = combine(loss, self._distillation_loss(micro_batch, log_prob, old_log_prob,
                                                                 student_topk if distill.uses_topk else None,
                                                                 metrics), distill)
                (loss * weight).backward()
            metrics["actor/grad_norm"].append(
                clip_grad_and_step(self.actor_module, self.actor_optimizer, self.max_grad_norm))
        skipped, self.skipped_in_row = count_skipped_steps(metrics["actor/grad_norm"], self.skipped_in_row)
        metrics["actor/skipped_steps"] = [float(skipped)]
        metrics["actor/skipped_steps_in_row"] = [float(self.skipped_in_row)]
        return dict(metrics)

    def _rl_loss(self, objective, micro_batch, log_prob, old_log_prob, entropy, is_weights, metrics) -> torch.Tensor:
        """policy_loss(objective.advantages(A)) - entropy_coeff * entropy + objective.kl_loss(kl) of one micro-batch;
        its metrics are appended to `metrics`."""
        cfg, mask = self.config, micro_batch["response_mask"]
        token_entropy = entropy.detach() if entropy is not None else None
        pg_loss, pg_metrics = objective.policy_loss(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=objective.advantages(micro_batch["advantages"], token_entropy, mask),
            response_mask=mask,
            entropy=token_entropy,
            rollout_is_weights=is_weights,
        )
        loss = pg_loss
        if cfg.entropy_coeff != 0:
            entropy_loss = compute_entropy_loss(entropy, mask, cfg.loss_agg_mode)
            loss = loss - cfg.entropy_coeff * entropy_loss
            metrics["actor/entropy_loss"].append(entropy_loss.item())
        if cfg.use_kl_loss:
            kld = kl_penalty(log_prob, micro_batch["ref_log_prob"], cfg.kl_loss_type)
            kl_loss, kl_metrics = objective.kl_loss(kld, token_entropy, mask)
            loss = loss + kl_loss
            for name, value in kl_metrics.items():
                metrics[name].append(float(value))
        metrics["actor/pg_loss"].append(pg_loss.item())
        for name, value in pg_metrics.items():
            metrics[name].append(float(value))
        return loss

    def _distillation_loss(self, micro_batch, log_prob, old_log_prob, student_topk, metrics) -> torch.Tensor:
        """The distillation term of one micro-batch (verl/algorithms/distillation.py) against the teachers'
        log-probs in the batch; `student_topk` `(bs, response_len, k)`: the student's log-probs at the teacher's top-k
        tokens (forward_kl_topk), else None. Its metrics are appended to `metrics`."""
        distill, mask = self.distillation, micro_batch["response_mask"]
        if student_topk is not None:
            per_token, student_mass, teacher_mass = forward_kl_topk(student_topk, micro_batch["teacher_topk_log_probs"],
                                                                    distill.log_prob_min_clamp)
            metrics["distillation/student_mass"].append(masked_mean(student_mass, mask).item())
            metrics["distillation/teacher_mass"].append(masked_mean(teacher_mass, mask).item())
        else:
            per_token = estimator_losses(log_prob, micro_batch["teacher_log_probs"], distill.loss_mode)
        loss, distill_metrics = distillation_loss(per_token, mask, distill, self.config.loss_agg_mode, log_prob,
                                                  old_log_prob)
        metrics["distillation/loss"].append(loss.item())
        for name, value in distill_metrics.items():
            metrics[name].append(float(value))
        return loss
