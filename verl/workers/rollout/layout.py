"""The trainer's rollout batch from an engine's completions (batch keys in docs/internal_contracts.md).

`generate_sequences` is the plain-sampling step: prompts `DataProto` in, rollout `DataProto` out.
`layout_responses` is the one layout step that it and the tool loops share: lists padded, then `layout_rollout_batch`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from verl.utils.torch_functional import get_response_mask, pad_2d_list_to_tensor
from verl.workers.rollout.base import RolloutEngine, SamplingParams

if TYPE_CHECKING:
    from verl.protocol import DataProto


def unpadded_prompts(prompts: DataProto) -> list[list[int]]:
    """The engine requests: `raw_prompt_ids` when the dataset kept them, else the prompt ids under the mask."""
    if "raw_prompt_ids" in prompts.non_tensor_batch:
        return [list(map(int, ids)) for ids in prompts.non_tensor_batch["raw_prompt_ids"]]
    # On the host: the rows are read one by one (each read of a GPU tensor would be a sync).
    input_ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].bool().cpu()
    return [row[row_mask].tolist() for row, row_mask in zip(input_ids, mask)]


def generate_sequences(
    engine: RolloutEngine,
    prompts: DataProto,
    params: SamplingParams,
    response_length: int,
    pad_token_id: int,
    eos_token_id: int | list[int],
) -> DataProto:
    """Sample responses for a left-padded prompt batch and lay them out as the trainer's rollout batch.

    prompts: batch `input_ids`, `attention_mask`, `position_ids` `(bs, prompt_len)`, left padded; optional
    non-tensor `raw_prompt_ids`. Generation is capped at `response_length` tokens (`params.max_tokens` if smaller).

    Returns `bs * params.n` rows, the n samples of a prompt adjacent, with batch keys
    `prompts` `(bs*n, prompt_len)`, `responses` `(bs*n, response_len)` right padded with `pad_token_id`,
    `input_ids` / `attention_mask` / `position_ids` `(bs*n, prompt_len + response_len)`, `response_mask`
    (1 on generated tokens up to and including EOS), `rollout_log_probs` and `rollout_entropys` (float32, 0 on
    padding); every non-tensor entry of `prompts` repeated n times, plus object arrays `finish_reason` and
    `stop_reason`; `meta_info` copied from `prompts`.
    """
    params = replace(params, max_tokens=min(params.max_tokens, response_length))
    outputs = [out for group in engine.generate(unpadded_prompts(prompts), params) for out in group]
    if len(outputs) != len(prompts) * params.n:
        raise RuntimeError(
            f"rollout engine returned {len(outputs)} completions for {len(prompts)} prompts x n={params.n}"
        )
    if params.n > 1:
        prompts = prompts.repeat(repeat_times=params.n, interleave=True)

    return layout_responses(
        prompts, [o.token_ids for o in outputs], response_length, pad_token_id, eos_token_id=eos_token_id,
        log_probs=[o.log_probs for o in outputs], entropies=[o.entropies for o in outputs],
        extra_non_tensors={"finish_reason": [o.finish_reason for o in outputs],
                           "stop_reason": [o.stop_reason for o in outputs]},
        versions=[[o.policy_version] * len(o.token_ids) for o in outputs]
        if all(o.policy_version is not None for o in outputs) else None)


def layout_responses(prompts: DataProto, responses: list[list[int]], response_length: int, pad_token_id: int,
                     log_probs: list[list[float]], entropies: list[list[float]], extra_non_tensors: dict,
                     response_mask: list[list[int]] | None = None,
                     eos_token_id: int | list[int] | None = None,
                     versions: list[list[int]] | None = None) -> DataProto:
    """The one layout step of every way of generating (plain sampling, the tool rounds, verl's agent loops): each
    row's response token ids, loss mask, log-probs and entropies as lists, right padded to `response_length`, then
    `layout_rollout_batch` with `prompts` (one row per response). Every response token is attended;
    `response_mask` (1 on tokens that train, 0 on tool results) defaults to all of them up to and including the first
    EOS (`eos_token_id`: the cut guards against an engine that returns tokens past EOS). Log-probs and entropies are
    0 where the mask is. `versions`: per token the policy version that sampled it (versioned.py), laid out as
    `response_policy_versions` (-1 off the mask)."""
    device = prompts.batch["input_ids"].device

    def pad(rows, value, dtype):
        return pad_2d_list_to_tensor(rows, value, max_length=response_length, dtype=dtype).to(device)

    padded = pad(responses, pad_token_id, torch.long)
    lengths = torch.tensor([len(r) for r in responses], device=device)
    attended = torch.arange(response_length, device=device)[None, :] < lengths[:, None]
    mask_dtype = prompts.batch["attention_mask"].dtype
    if response_mask is None:
        mask = attended if eos_token_id is None else attended & get_response_mask(padded, eos_token_id).bool()
        mask = mask.to(mask_dtype)
    else:
        mask = pad(response_mask, 0, mask_dtype)
    batch = layout_rollout_batch(
        prompts, padded, attended if response_mask is not None else mask, mask,
        log_probs=pad(log_probs, 0.0, torch.float32) * mask, entropys=pad(entropies, 0.0, torch.float32) * mask,
        extra_non_tensors=extra_non_tensors, pad_token_id=pad_token_id)
    if versions is not None:
        batch.batch["response_policy_versions"] = torch.where(mask.bool(), pad(versions, -1, torch.int32), -1).to(
            torch.int32)
    return batch


def layout_rollout_batch(prompts: DataProto, responses: torch.Tensor, attended: torch.Tensor,
                         response_mask: torch.Tensor, log_probs: torch.Tensor, entropys: torch.Tensor,
                         extra_non_tensors: dict, pad_token_id: int) -> DataProto:
    """The trainer's rollout batch (keys in docs/internal_contracts.md) from prompts repeated to one row per response.

    responses `(bs, response_len)` right padded; attended: 1 on every response token the model sees (the response's
    part of `attention_mask`); response_mask: 1 on the tokens that train (equal to `attended` for plain sampling,
    0 on tool results for the agent loop); log_probs, entropys: the engine's, 0 where nothing was sampled. The
    prompt side's tensors are named in `meta_info[LEFT_PAD]` with their pad values, so that batches whose prompts are
    padded to other widths (another rank's, whose agent loops rendered longer prompts) concatenate.
    """
    from verl.protocol import LEFT_PAD, DataProto

    prompt_ids, prompt_mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    prompt_pos = prompts.batch["position_ids"]
    # Response positions continue from each prompt's last position (also across right padding, which is masked).
    steps = torch.arange(1, responses.shape[1] + 1, device=prompt_ids.device, dtype=prompt_pos.dtype)
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, attended.to(prompt_mask.dtype)], dim=1),
        "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + steps[None, :]], dim=1),
        "response_mask": response_mask.to(prompt_mask.dtype),
        "rollout_log_probs": log_probs,
        "rollout_entropys": entropys,
    }
    non_tensors = {**prompts.non_tensor_batch, **extra_non_tensors}
    left_pad = {"prompts": pad_token_id, "input_ids": pad_token_id, "attention_mask": 0, "position_ids": 0}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors,
                               meta_info={**prompts.meta_info, LEFT_PAD: left_pad})
