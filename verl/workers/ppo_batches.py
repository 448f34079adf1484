"""The order of a PPO update, shared by the actor and the critic: `ppo_epochs` passes over the batch (shuffled with
`shuffle`), each cut into mini-batches of `ppo_mini_batch_size` sequences (one optimizer step each), each cut into
micro-batches (one forward and backward each) whose loss weights make the summed gradients those of the loss
aggregated over the whole mini-batch of every rank.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from tensordict import TensorDict

from verl.utils.run_plan import UpdateBatches
from verl.utils.seqlen_balancing import split_micro_batches


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
        # Where the mini-batch is: the workers' group reduces CUDA tensors over NCCL and CPU ones over gloo (BACKENDS).
        dist.all_reduce(tokens)
    tokens = tokens.clamp(min=1)
    return [micro["response_mask"].sum() * world / tokens.to(micro["response_mask"].device) for micro in micro_batches]


def ppo_mini_batches(batch: TensorDict, config,
                     batches: UpdateBatches | None) -> Iterator[list[tuple[TensorDict, torch.Tensor | float]]]:
    """The mini-batches of a PPO update, in order, each as its (micro_batch, loss weight) pairs; the caller takes
    one optimizer step after each.

    `config` is the actor's or the critic's node; read: ppo_epochs, shuffle (epoch e uses the permutation of seed e)
    and loss_agg_mode (`micro_batch_weights`). `batches` is the plan's `UpdateBatches` of that model
    (verl/trainer/ppo/run_plan.py): `mini_batch` sequences per rank, cut into `micro` micro-batches (sequences, or a
    token budget with use_dynamic_bsz).
    """
    if batches is None:
        raise ValueError("a PPO update needs its planned batch sizes (run_plan.UpdateBatches); this model was built "
                         "without them, for forward passes only")
    for epoch in range(config.ppo_epochs):
        if config.shuffle:
            generator = torch.Generator().manual_seed(epoch)
            batch = batch[torch.randperm(batch.batch_size[0], generator=generator)]
        for mini_batch in batch.split(batches.mini_batch):
            micro_batches, _ = split_micro_batches(mini_batch, batches.micro.size, batches.micro.max_token_len)
            yield list(zip(micro_batches, micro_batch_weights(mini_batch, micro_batches, config.loss_agg_mode)))
