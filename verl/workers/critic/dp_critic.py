"""The data-parallel critic: values of the responses' tokens, and the value-function update.

One instance lives in each FSDP rank and sees only that rank's share of the batch; FSDP averages gradients across
ranks. As in the actor, the loss of a mini-batch is accumulated over micro-batches with the weights of
`verl/workers/ppo_batches.py`, which make the gradient that of the loss aggregated over the whole mini-batch of every
rank.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from verl.algorithms.critic_loss import compute_value_loss
from verl.protocol import DataProto
from verl.utils.config import option
from verl.utils.fsdp_utils import clip_grad_and_step, count_skipped_steps, reshard_all
from verl.utils.packing import (
    cut_shared_left_padding,
    pack_rows,
    response_predictors,
    unpack_responses,
    uses_varlen_attention,
)
from verl.utils.run_plan import MicroBatches, UpdateBatches
from verl.utils.seqlen_balancing import restore_order, split_micro_batches
from verl.utils.torch_functional import masked_mean
from verl.utils.ulysses import ulysses_forward
from verl.workers.ppo_batches import ppo_mini_batches

CRITIC = "critic"
FORWARD_KEYS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]


class DataParallelPPOCritic:
    """Computes values and updates the value model of one FSDP rank.

    `config` is the `critic` node (its loss keys: ppo_epochs, shuffle, cliprange_value, loss_agg_mode, grad_clip);
    the sizes of this rank's batches come from the run plan (verl/trainer/ppo/run_plan.py): `batches`, the update's
    mini- and micro-batches (needed to update), and `forward`, the value pass's micro-batches.
    `critic_module` is a Hugging Face token-classification model with one label (a scalar value head).
    """

    def __init__(self, config, critic_module: torch.nn.Module, critic_optimizer: torch.optim.Optimizer | None = None,
                 *, use_remove_padding: bool, batches: UpdateBatches | None = None,
                 forward: MicroBatches | None = None, sp_group=None):
        self.config = config
        self.sp_group = sp_group  # Ulysses sequence parallelism, as the actor's (dp_actor.DataParallelPPOActor)
        self.batches, self.forward = batches, forward
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.use_remove_padding = use_remove_padding
        # verl's critic.grad_clip wins over optim.clip_grad when set.
        grad_clip = option(config, "grad_clip", CRITIC)
        self.max_grad_norm = grad_clip if grad_clip is not None else option(config.get("optim"), "clip_grad",
                                                                              f"{CRITIC}.optim")
        self.varlen_attention = uses_varlen_attention(critic_module.config)
        self.filler_token_id = getattr(critic_module.config, "pad_token_id", None) or 0
        self.skipped_in_row = 0  # optimizer steps skipped in a row, across updates (non-finite gradient norm)

    # ----------------------------------------------------------------------------------------------- forward
    def _forward_micro_batch(self, micro_batch) -> torch.Tensor:
        """Values `(batch, response_len)` of the response tokens, 0 on padding.

        The value of response token t is the value head's output at the position before it, i.e. on the state
        (prompt + tokens < t) from which the policy emitted t; verl takes the same slice, positions
        -response_len-1 .. -2 of the sequence. With `use_remove_padding` the real tokens go through the model packed
        into rows (verl/utils/packing.py).
        """
        response_mask = micro_batch["response_mask"]
        response_length = response_mask.shape[-1]
        input_ids, attention_mask, position_ids = cut_shared_left_padding(
            micro_batch["input_ids"], micro_batch["attention_mask"], micro_batch["position_ids"], response_length)
        if self.use_remove_padding:
            rows, positions, destination = pack_rows(input_ids, attention_mask, position_ids, self.filler_token_id,
                                                     self.varlen_attention)
            mask = None
        else:
            rows, positions, mask = input_ids, position_ids, attention_mask
        # Under Ulysses sequence parallelism each rank of `sp_group` runs the model on one piece of every row and the
        # values of all positions are gathered, whole, on every rank; without a group the block changes nothing.
        with ulysses_forward(self.critic_module, self.sp_group, rows, mask, positions) as sp:
            local = self.critic_module(**sp.model_inputs, use_cache=False).logits[..., 0].float()
            values = sp.gather(local, dim=1)
        if not self.use_remove_padding:
            return values[:, -response_length - 1 : -1] * response_mask
        scored, before = response_predictors(attention_mask, destination, response_length)
        return unpack_responses(values.flatten()[before], scored)

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values `(batch, response_len)` of `responses` under the current weights, 0 outside `response_mask`; no
        gradient. Micro-batches as planned (`forward`: sequences, or a token budget with use_dynamic_bsz; none
        planned: the whole batch at once)."""
        self.critic_module.eval()
        size, max_token_len = (self.forward.size, self.forward.max_token_len) if self.forward else (None, None)
        batch = data.select(batch_keys=FORWARD_KEYS).batch
        micro_batches, index_map = split_micro_batches(batch, size, max_token_len)
        values = torch.cat([self._forward_micro_batch(micro_batch) for micro_batch in micro_batches])
        reshard_all(self.critic_module)  # with reshard_after_forward=false, no backward pass would free them
        return restore_order(values, index_map) * data.batch["response_mask"]

    # ------------------------------------------------------------------------------------------------ update
    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """`ppo_epochs` passes over mini-batches of `ppo_mini_batch_size` sequences, one optimizer step each, of
        the clipped value loss (verl/algorithms/critic_loss.py) against `returns`, clipped around `values`.

        Returns metrics as lists (one entry per micro-batch or per optimizer step), with `critic/skipped_steps` and
        `critic/skipped_steps_in_row` as the actor's (`count_skipped_steps`).
        """
        cfg = self.config
        self.critic_module.train()
        metrics = defaultdict(list)
        batch = data.select(batch_keys=FORWARD_KEYS + ["values", "returns"]).batch
        for micro_batches in ppo_mini_batches(batch, cfg, self.batches):
            for micro_batch, weight in micro_batches:
                mask = micro_batch["response_mask"]
                vpreds = self._forward_micro_batch(micro_batch)
                vf_loss, vf_clipfrac = compute_value_loss(
                    vpreds=vpreds, returns=micro_batch["returns"], values=micro_batch["values"],
                    response_mask=mask, cliprange_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode)
                (vf_loss * weight).backward()
                metrics["critic/vf_loss"].append(vf_loss.item())
                metrics["critic/vf_clipfrac"].append(vf_clipfrac.item())
                metrics["critic/vpred_mean"].append(masked_mean(vpreds.detach(), mask).item())
            metrics["critic/grad_norm"].append(
                clip_grad_and_step(self.critic_module, self.critic_optimizer, self.max_grad_norm, who="critic"))
        skipped, self.skipped_in_row = count_skipped_steps(metrics["critic/grad_norm"], self.skipped_in_row)
        metrics["critic/skipped_steps"] = [float(skipped)]
        metrics["critic/skipped_steps_in_row"] = [float(self.skipped_in_row)]
        return dict(metrics)
