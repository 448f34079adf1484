"""The data-parallel actor: log-probs and entropy of responses, and the policy update.

One instance lives in each FSDP rank. It sees only that rank's share of the batch; FSDP averages gradients across
ranks. The loss of one mini-batch is accumulated over micro-batches so that its gradient equals the gradient of the
loss aggregated over the whole (per-rank) mini-batch.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import defaultdict

import torch

from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.policy_losses import entropy_aware_advantage, split_by_token_entropy, split_kl_loss
from verl.utils.config import option
from verl.utils.fsdp_utils import clip_grad_and_step, reshard_all
from verl.utils.seqlen_balancing import get_reverse_idx, rearrange_micro_batches
from verl.utils.torch_functional import logprobs_and_entropy

ACTOR = "actor_rollout_ref.actor"

FORWARD_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]
# Attention kernels that keep the sequences of one packed row apart at no cost for the row's length.
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")
# Positions per chunk with entropy_from_logits_with_chunking (verl's chunk: 2048 tokens).
LOGITS_CHUNK = 2048


def split_micro_batches(batch, micro_batch_size: int | None, max_token_len: int | None):
    """Cut a TensorDict into micro-batches by size, or by token budget when `max_token_len` is given.

    Returns (micro_batches, index_map); index_map is None for plain splits and otherwise maps the concatenated
    micro-batch rows back to the original order.
    """
    if max_token_len is not None:
        micro_batches, indices = rearrange_micro_batches(batch, max_token_len=max_token_len)
        return micro_batches, [i for part in indices for i in part]
    size = micro_batch_size or batch.batch_size[0]
    return batch.split(size), None


def pack_first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` grouped into bins of total length <= `capacity` (longest first, each into the first bin
    it fits; one longer than `capacity` gets a bin of its own). Bins keep their members in index order."""
    bins, room = [], []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, free in enumerate(room):
            if lengths[index] <= free:
                bins[b].append(index)
                room[b] -= lengths[index]
                break
        else:
            bins.append([index])
            room.append(capacity - lengths[index])
    return [sorted(members) for members in bins]


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


class DataParallelPPOActor:
    """Computes log-probs and updates the policy of one FSDP rank.

    `config` is the `actor_rollout_ref.actor` node, with `ppo_mini_batch_size` already turned into sequences per rank
    by the worker (prompts * rollout.n / ranks).
    """

    def __init__(self, config, actor_module: torch.nn.Module, actor_optimizer: torch.optim.Optimizer | None = None,
                 use_remove_padding: bool = False):
        self.config = config
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
        self.varlen_attention = getattr(hf_model.config, "_attn_implementation", None) in VARLEN_ATTENTION
        self.filler_token_id = getattr(hf_model.config, "pad_token_id", None) or 0

    # ----------------------------------------------------------------------------------------------- forward
    def _forward_micro_batch(self, micro_batch, temperature: float, calculate_entropy: bool):
        """(entropy or None, log_probs), each `(batch, response_len)`, at the sampling temperature.

        Columns that are padding in every row are cut first. With `use_remove_padding` the sequences' real tokens go
        through the model as one packed row whose position ids restart at 0 for each sequence; the model's attention
        keeps the sequences apart (transformers derives a block-diagonal causal mask from such position ids with sdpa
        and eager attention, and varlen kernels with flash-attn), so no compute is spent on padding. Log-probs at
        padded response positions are 0 on that path.
        """
        responses = micro_batch["responses"]
        response_length = responses.shape[-1]
        attention_mask = micro_batch["attention_mask"]
        # Left padding shared by all rows holds no token of any sequence.
        first = int(attention_mask.any(dim=0).int().argmax())
        first = min(first, attention_mask.shape[1] - response_length - 1)
        input_ids = micro_batch["input_ids"][:, first:]
        position_ids = micro_batch["position_ids"][:, first:]
        attention_mask = attention_mask[:, first:]
        chunking = {"chunk_size": self.logits_chunk_size, "checkpoint": self.entropy_checkpointing}
        if self.use_remove_padding:
            return self._forward_packed(input_ids, attention_mask, position_ids, responses, temperature,
                                        calculate_entropy, chunking)
        # The logits at position t predict token t+1, so the response tokens are predicted by the slice before them;
        # models that can (HF's `logits_to_keep`) apply the LM head to those positions only.
        keep = {"logits_to_keep": response_length + 1} if self.takes_logits_to_keep else {}
        output = self.actor_module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=False, **keep)
        logits = output.logits[:, -response_length - 1 : -1, :]
        log_probs, entropy = logprobs_and_entropy(logits, responses, temperature, calculate_entropy, **chunking)
        return entropy, log_probs

    def _forward_packed(self, input_ids, attention_mask, position_ids, responses, temperature, calculate_entropy,
                        chunking):
        """The forward pass over the real tokens only, packed into rows (see `_forward_micro_batch`).

        With a varlen attention kernel (flash-attn) all sequences share one row. Otherwise attention over a packed
        row costs (row length)^2 whatever the mask, so sequences are packed first-fit-decreasing into rows no longer
        than the padded batch's: never more rows nor longer ones than the padded pass, less padding. Rows end in
        filler tokens that form a sequence of their own.
        """
        batch, length = attention_mask.shape
        response_length = responses.shape[-1]
        real = attention_mask.bool()
        lengths = real.sum(dim=1).tolist()
        capacity = sum(lengths) if self.varlen_attention else length
        rows = pack_first_fit(lengths, capacity)
        width = max(sum(lengths[b] for b in row) for row in rows)
        row_of = torch.empty(batch, dtype=torch.long)
        start = torch.empty(batch, dtype=torch.long)
        fill = torch.empty(len(rows), dtype=torch.long)
        for r, members in enumerate(rows):
            offset = 0
            for b in members:
                row_of[b], start[b] = r, offset
                offset += lengths[b]
            fill[r] = offset
        # destination[b, t]: the flat index in the packed (rows, width) tensors of token (b, t) (valid where real).
        device = input_ids.device
        destination = (row_of[:, None] * width + start[:, None]).to(device) + real.long().cumsum(dim=1) - 1
        columns = torch.arange(width, device=device)
        packed_ids = torch.full((len(rows) * width,), self.filler_token_id, dtype=input_ids.dtype, device=device)
        packed_ids[destination[real]] = input_ids[real]
        # Filler positions count from 0, so each row's filler is a sequence of its own.
        packed_positions = (columns[None, :] - fill.to(device)[:, None]).flatten()
        packed_positions[destination[real]] = position_ids[real]
        scored = real[:, length - response_length:]  # response positions holding a token
        # The token at position t is predicted by the logits at t - 1, a real token whenever t is one.
        predictors = destination[:, length - response_length - 1 : length - 1][scored]
        with lm_head_on_rows(self.actor_module, predictors) as selected:
            output = self.actor_module(input_ids=packed_ids.view(len(rows), width),
                                       position_ids=packed_positions.view(len(rows), width), attention_mask=None,
                                       use_cache=False)
        logits = output.logits[0] if selected else output.logits.flatten(0, 1)[predictors]
        log_prob, entropy = logprobs_and_entropy(logits, responses[scored], temperature, calculate_entropy,
                                                 **chunking)

        def unpack(values):
            return torch.zeros(batch, response_length, dtype=values.dtype, device=values.device).masked_scatter(
                scored, values)

        return (unpack(entropy) if calculate_entropy else None), unpack(log_prob)

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False):
        """Log-probs (and entropy) of `responses` under the current weights; no gradient.

        meta_info: `temperature`, `micro_batch_size` (sequences per forward), `use_dynamic_bsz`, `max_token_len`.
        Returns `(log_probs, entropys or None)`, each `(batch, response_len)`.
        """
        self.actor_module.eval()
        temperature = data.meta_info["temperature"]
        max_token_len = data.meta_info["max_token_len"] if data.meta_info.get("use_dynamic_bsz") else None
        batch = data.select(batch_keys=FORWARD_KEYS).batch
        micro_batches, index_map = split_micro_batches(batch, data.meta_info.get("micro_batch_size"), max_token_len)
        log_probs, entropys = [], []
        for micro_batch in micro_batches:
            entropy, log_prob = self._forward_micro_batch(micro_batch, temperature, calculate_entropy)
            log_probs.append(log_prob)
            if calculate_entropy:
                entropys.append(entropy)
        reshard_all(self.actor_module)  # with reshard_after_forward=false, no backward pass would free them
        log_probs = torch.cat(log_probs)
        entropys = torch.cat(entropys) if calculate_entropy else None
        if index_map is not None:
            reverse = torch.tensor(get_reverse_idx(index_map), dtype=torch.long)
            log_probs = log_probs[reverse]
            entropys = entropys[reverse] if calculate_entropy else None
        return log_probs, entropys

    # ------------------------------------------------------------------------------------------------ update
    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO update: `ppo_epochs` passes over mini-batches of `ppo_mini_batch_size` sequences.

        Needs `responses`, `response_mask`, `old_log_probs`, `advantages` (and `ref_log_prob` with use_kl_loss).
        Returns metrics as lists (one entry per micro-batch or per optimizer step).
        """
        cfg = self.config
        self.actor_module.train()
        temperature = data.meta_info["temperature"]
        policy_loss_fn = core_algos.get_policy_loss_fn(cfg.policy_loss.loss_mode)
        # Archer: the KL loss weighs low- and high-entropy tokens by different coefficients.
        split_kl = cfg.use_kl_loss and option(cfg, "use_token_entropy_separate", ACTOR)
        entropy_adv = option(cfg, "enable_entropy_balanced_advantage", ACTOR)
        # The seed code skipped entropy when entropy_coeff=0, silently disabling what needs it (AEPO bug 2).
        needs_entropy = (cfg.entropy_coeff != 0 or getattr(policy_loss_fn, "needs_entropy", False) or split_kl
                         or entropy_adv)
        keys = FORWARD_KEYS + ["response_mask", "advantages"]
        if cfg.use_kl_loss:
            keys.append("ref_log_prob")
        # Without old log-probs the update must be on-policy (one epoch, one mini-batch): the old policy is then the
        # current one, and its log-probs are this forward pass's, detached (see old_log_prob_source in ray_trainer).
        has_old = "old_log_probs" in data.batch.keys()
        if has_old:
            keys.append("old_log_probs")
        elif cfg.ppo_epochs != 1 or len(data) > cfg.ppo_mini_batch_size:
            raise ValueError(f"update_policy got no old_log_probs, which only an on-policy update can do without "
                             f"(ppo_epochs=1 and one mini-batch); here ppo_epochs={cfg.ppo_epochs} and {len(data)} "
                             f"sequences per rank in mini-batches of {cfg.ppo_mini_batch_size}")
        batch = data.select(batch_keys=keys).batch
        max_token_len = cfg.ppo_max_token_len_per_gpu if cfg.use_dynamic_bsz else None
        metrics = defaultdict(list)

        for epoch in range(cfg.ppo_epochs):
            if cfg.shuffle:
                generator = torch.Generator().manual_seed(epoch)
                batch = batch[torch.randperm(batch.batch_size[0], generator=generator)]
            for mini_batch in batch.split(cfg.ppo_mini_batch_size):
                micro_batches, _ = split_micro_batches(mini_batch, cfg.ppo_micro_batch_size_per_gpu, max_token_len)
                # Weights that make the sum over micro-batches equal the loss aggregated over the mini-batch.
                mini_tokens = mini_batch["response_mask"].sum().clamp(min=1)
                mini_seqs = mini_batch.batch_size[0]
                for micro_batch in micro_batches:
                    mask = micro_batch["response_mask"]
                    if cfg.loss_agg_mode == "token-mean":
                        weight = mask.sum() / mini_tokens
                    else:
                        weight = micro_batch.batch_size[0] / mini_seqs
                    entropy, log_prob = self._forward_micro_batch(micro_batch, temperature, needs_entropy)
                    token_entropy = entropy.detach() if entropy is not None else None
                    advantages = micro_batch["advantages"]
                    if entropy_adv:
                        advantages = entropy_aware_advantage(advantages, token_entropy, mask,
                                                             alpha=option(cfg, "entropy_advantage_alpha", ACTOR))
                    pg_loss, pg_metrics = policy_loss_fn(
                        old_log_prob=micro_batch["old_log_probs"] if has_old else log_prob.detach(),
                        log_prob=log_prob,
                        advantages=advantages,
                        response_mask=mask,
                        loss_agg_mode=cfg.loss_agg_mode,
                        config=cfg,
                        entropy=token_entropy,
                    )
                    loss = pg_loss
                    if cfg.entropy_coeff != 0:
                        entropy_loss = core_algos.compute_entropy_loss(entropy, mask, cfg.loss_agg_mode)
                        loss = loss - cfg.entropy_coeff * entropy_loss
                        metrics["actor/entropy_loss"].append(entropy_loss.item())
                    if cfg.use_kl_loss:
                        kld = core_algos.kl_penalty(log_prob, micro_batch["ref_log_prob"], cfg.kl_loss_type)
                        if split_kl:
                            high, low = split_by_token_entropy(token_entropy, mask, cfg.token_entropy_quantile)
                            kl_term, kl_metrics = split_kl_loss(kld, high, low, low_coef=cfg.kl_loss_coef,
                                                                high_coef=cfg.high_entropy_kl_loss_scale_coef)
                            loss = loss + kl_term
                            for name, value in kl_metrics.items():
                                metrics[name].append(float(value))
                        else:
                            kl_loss = core_algos.agg_loss(kld, mask, cfg.loss_agg_mode)
                            loss = loss + cfg.kl_loss_coef * kl_loss
                            metrics["actor/kl_loss"].append(kl_loss.item())
                        metrics["actor/kl_coef"].append(cfg.kl_loss_coef)
                    (loss * weight).backward()
                    metrics["actor/pg_loss"].append(pg_loss.item())
                    for name, value in pg_metrics.items():
                        metrics[name].append(float(value))
                metrics["actor/grad_norm"].append(
                    clip_grad_and_step(self.actor_module, self.actor_optimizer, self.max_grad_norm))
        return dict(metrics)

