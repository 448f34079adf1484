"""The data-parallel actor: log-probs and entropy of responses, and the policy update.

One instance lives in each FSDP rank. It sees only that rank's share of the batch; FSDP averages gradients across
ranks. The loss of one mini-batch is accumulated over micro-batches so that its gradient equals the gradient of the
loss aggregated over the whole mini-batch: with token-mean, over the tokens of every rank's share (see
`micro_batch_weights`). What the loss is (policy loss, advantage transforms, KL term) is the actor objective of
`verl/algorithms/losses/base.py`, built from the actor config.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import defaultdict

import torch
import torch.distributed as dist

from verl.algorithms import build_actor_objective
from verl.algorithms.kl import kl_penalty
from verl.algorithms.primitives import compute_entropy_loss
from verl.protocol import DataProto
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


def micro_batch_weights(mini_batch, micro_batches, loss_agg_mode: str) -> list[torch.Tensor | float]:
    """The factor of each micro-batch's loss such that the summed gradients are those of the mini-batch's loss.

    token-mean promises every token the same weight across all data-parallel ranks, and FSDP divides the sum of the
    ranks' gradients by the number of ranks W. So the token count is the mini-batch's over every rank, T (one
    all-reduce over the default process group, FSDP's mesh, when torch.distributed runs with W > 1):

        token-mean   w_j = n_j * W / T        n_j = valid tokens of micro-batch j on this rank
                     (1/W) sum_ranks sum_j w_j mean_j(l) = sum over every rank's tokens of l / T
        seq-mean-*   w_j = B_j / B             sequences of micro-batch j over those of this rank's mini-batch
                     (every rank holds as many sequences, so FSDP's average is already the global mean)

    Every rank must call this for every mini-batch (the all-reduce is a collective).
    """
    if loss_agg_mode != "token-mean":
        return [micro.batch_size[0] / mini_batch.batch_size[0] for micro in micro_batches]
    tokens = mini_batch["response_mask"].sum()
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world > 1:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else tokens.device
        tokens = tokens.to(device)
        dist.all_reduce(tokens)
    tokens = tokens.clamp(min=1)
    return [micro["response_mask"].sum() * world / tokens.to(micro["response_mask"].device) for micro in micro_batches]


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
    def _forward_micro_batch(self, micro_batch, temperature: float, calculate_entropy: bool,
                             calculate_sum_pi_squared: bool = False):
        """(entropy or None, log_probs, sum_pi_squared or None), each `(batch, response_len)`, at the sampling
        temperature; sum_pi_squared is sum_v softmax(logits / T)_v^2 at each response position.

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
        chunking = {"chunk_size": self.logits_chunk_size, "checkpoint": self.entropy_checkpointing,
                    "with_sum_pi_squared": calculate_sum_pi_squared}
        if self.use_remove_padding:
            return self._forward_packed(input_ids, attention_mask, position_ids, responses, temperature,
                                        calculate_entropy, chunking)
        # The logits at position t predict token t+1, so the response tokens are predicted by the slice before them;
        # models that can (HF's `logits_to_keep`) apply the LM head to those positions only.
        keep = {"logits_to_keep": response_length + 1} if self.takes_logits_to_keep else {}
        output = self.actor_module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=False, **keep)
        logits = output.logits[:, -response_length - 1 : -1, :]
        log_probs, entropy, *sum_pi_squared = logprobs_and_entropy(logits, responses, temperature, calculate_entropy,
                                                                   **chunking)
        return entropy, log_probs, (sum_pi_squared[0] if sum_pi_squared else None)

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
        log_prob, entropy, *sum_pi_squared = logprobs_and_entropy(logits, responses[scored], temperature,
                                                                  calculate_entropy, **chunking)

        def unpack(values):
            return torch.zeros(batch, response_length, dtype=values.dtype, device=values.device).masked_scatter(
                scored, values)

        return ((unpack(entropy) if calculate_entropy else None), unpack(log_prob),
                (unpack(sum_pi_squared[0]) if sum_pi_squared else None))

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False,
                         calculate_sum_pi_squared: bool = False):
        """Log-probs (and entropy) of `responses` under the current weights; no gradient.

        meta_info: `temperature`, `micro_batch_size` (sequences per forward), `use_dynamic_bsz`, `max_token_len`.
        Returns `(log_probs, entropys or None)`, each `(batch, response_len)`; with `calculate_sum_pi_squared`,
        `(log_probs, entropys or None, sum_pi_squared)`, sum_pi_squared = sum_v softmax(logits / T)_v^2 at each
        response position (0 on padding with use_remove_padding), which the optimal token baseline needs.
        """
        self.actor_module.eval()
        temperature = data.meta_info["temperature"]
        max_token_len = data.meta_info["max_token_len"] if data.meta_info.get("use_dynamic_bsz") else None
        batch = data.select(batch_keys=FORWARD_KEYS).batch
        micro_batches, index_map = split_micro_batches(batch, data.meta_info.get("micro_batch_size"), max_token_len)
        parts = [self._forward_micro_batch(micro_batch, temperature, calculate_entropy, calculate_sum_pi_squared)
                 for micro_batch in micro_batches]
        reshard_all(self.actor_module)  # with reshard_after_forward=false, no backward pass would free them
        reverse = None if index_map is None else torch.tensor(get_reverse_idx(index_map), dtype=torch.long)

        def gather(column: int, wanted: bool = True) -> torch.Tensor | None:
            if not wanted:
                return None
            values = torch.cat([part[column] for part in parts])
            return values if reverse is None else values[reverse]

        log_probs, entropys = gather(1), gather(0, calculate_entropy)
        if calculate_sum_pi_squared:
            return log_probs, entropys, gather(2)
        return log_probs, entropys

    # ------------------------------------------------------------------------------------------------ update
    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO update: `ppo_epochs` passes over mini-batches of `ppo_mini_batch_size` sequences.

        Needs `responses`, `response_mask`, `old_log_probs`, `advantages` (and `ref_log_prob` with use_kl_loss);
        `rollout_is_weights` `(bs, response_len)`, when present, goes to the policy loss. Per micro-batch:

            loss = policy_loss(objective.advantages(A)) - entropy_coeff * entropy + objective.kl_loss(kl)

        Returns metrics as lists (one entry per micro-batch or per optimizer step).
        """
        cfg = self.config
        self.actor_module.train()
        temperature = data.meta_info["temperature"]
        objective = build_actor_objective(cfg)
        keys = FORWARD_KEYS + ["response_mask", "advantages"]
        if cfg.use_kl_loss:
            keys.append("ref_log_prob")
        has_is_weights = "rollout_is_weights" in data.batch.keys()
        if has_is_weights:
            keys.append("rollout_is_weights")
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
                weights = micro_batch_weights(mini_batch, micro_batches, cfg.loss_agg_mode)
                for micro_batch, weight in zip(micro_batches, weights):
                    mask = micro_batch["response_mask"]
                    entropy, log_prob, _ = self._forward_micro_batch(micro_batch, temperature,
                                                                     objective.needs_entropy)
                    token_entropy = entropy.detach() if entropy is not None else None
                    pg_loss, pg_metrics = objective.policy_loss(
                        old_log_prob=micro_batch["old_log_probs"] if has_old else log_prob.detach(),
                        log_prob=log_prob,
                        advantages=objective.advantages(micro_batch["advantages"], token_entropy, mask),
                        response_mask=mask,
                        entropy=token_entropy,
                        rollout_is_weights=micro_batch["rollout_is_weights"] if has_is_weights else None,
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
                    (loss * weight).backward()
                    metrics["actor/pg_loss"].append(pg_loss.item())
                    for name, value in pg_metrics.items():
                        metrics[name].append(float(value))
                metrics["actor/grad_norm"].append(
                    clip_grad_and_step(self.actor_module, self.actor_optimizer, self.max_grad_norm))
        return dict(metrics)
