r"""Put the reference answer y* in place of the model's answer and find the tokens that score it.

For a response o = (reasoning z, answer y) the "PR sequence", built as the official RLPR implementation builds it, is
x + z + <answer> + lw + y* + tw + </answer> + EOS: everything the model wrote up to its last `<answer>` tag is kept
as written (for R1 that includes the text between `</think>` and `<answer>`), lw is the whitespace the model put after
`<answer>` (a single space when it put none) and tw is a single space. The y* tokens are those whose character span
overlaps the inserted y*; a token that straddles the boundary (one that merges the leading space with y*'s first
word) counts.

A response is valid when it has exactly one `<answer>` followed by some non-space text (`</answer>` is not needed, so
a truncated answer is still scored) and, for R1, exactly one `<think>` and one `</think>` before it, in that order.
An invalid response, or one whose PR sequence does not fit (checked per row, not against the batch's padded width
as the official code does), gets an all-zero y* mask: scoreB = 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from verl.workers.reward_manager.rlpr.scoring import FORMAT_MODES


@dataclass
class Spliced:
    text: str  # the whole PR sequence: prompt text + new response text
    response_start: int  # character offset of the last "<answer>" (the response part starts at its first token)
    answer_span: tuple[int, int]  # character span of y* in `text`
    valid: bool


def is_valid(response: str, mode: str = "R1") -> bool:
    """The validity rule of the module docstring."""
    if mode not in FORMAT_MODES:
        raise ValueError(f"reward_model.format_mode={mode!r} must be one of {FORMAT_MODES}")
    if response.count("<answer>") != 1:
        return False
    answer_at = response.index("<answer>")
    if not response[answer_at + len("<answer>") :].strip():
        return False
    if mode == "R1":
        if response.count("<think>") != 1 or response.count("</think>") != 1:
            return False
        return response.index("<think>") < response.index("</think>") < answer_at
    return True


def splice_reference(prompt: str, response: str, reference: str, eos: str, mode: str = "R1",
                     allow_empty_leading_whitespaces: bool = False, gt_tokens_one_more: bool = False) -> Spliced:
    """The PR sequence of one response (decoded with special tokens, padding removed) and where y* sits in it.

    allow_empty_leading_whitespaces: keep an empty lw as written (else one space). gt_tokens_one_more: tw is the
    model's whitespace before its `</answer>` (the official option that also scores the token after y*)."""
    valid = is_valid(response, mode)
    trailing = " "
    if valid:
        answer_at = response.rindex("<answer>")
        after = response[answer_at + len("<answer>") :]
        leading = re.match(r"\s*", after).group(0)
        leading = leading if leading or allow_empty_leading_whitespaces else " "
        head = response[:answer_at]
        if gt_tokens_one_more and "</answer>" in after:
            trailing = re.search(r"\s*$", after[: after.index("</answer>")]).group(0)
    else:  # a stand-in of the same shape, never scored
        leading, head = " ", ""
    start = len(prompt) + len(head)
    text = f"{prompt}{head}<answer>{leading}"
    span = (len(text), len(text) + len(reference))
    text += f"{reference}{trailing}</answer>{eos}"
    return Spliced(text=text, response_start=start, answer_span=span, valid=valid)


def tokenize_spliced(spliced: Spliced, tokenizer, max_prompt: int, max_response: int, one_more: bool = False) -> dict:
    """Token ids of the prompt part and the response part (split at the first token overlapping `<answer>`) and the
    y* mask over the response part; a PR sequence longer than the limits is marked invalid (mask all zero). With
    `one_more` the token after y* is masked in too, marked 2 in the mask (the manager may cap its log-prob)."""
    encoded = tokenizer(spliced.text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    split = next((i for i, (_, end) in enumerate(offsets) if end > spliced.response_start), len(ids))
    prompt_ids, response_ids = ids[:split], ids[split:]
    lo, hi = spliced.answer_span
    mask = [int(start < hi and end > lo) for start, end in offsets[split:]]
    if one_more and 1 in mask:
        after = len(mask) - mask[::-1].index(1)
        if after < len(mask):
            mask[after] = 2
    fits = len(prompt_ids) <= max_prompt and len(response_ids) <= max_response
    if not (spliced.valid and fits):
        mask = [0] * len(mask)
    return {"prompt_ids": prompt_ids[-max_prompt:], "response_ids": response_ids[:max_response],
            "answer_mask": mask[:max_response], "valid": spliced.valid and fits}


def build_pr_batch(rows: list[dict], pad_token_id: int, max_prompt: int, max_response: int) -> dict[str, torch.Tensor]:
    """Left-padded prompt parts and right-padded response parts of `tokenize_spliced` rows as the tensors the actor's
    log-prob pass takes (`input_ids`, `attention_mask`, `position_ids`, `responses`) plus `answer_mask`."""
    n = len(rows)
    prompts = torch.full((n, max_prompt), pad_token_id, dtype=torch.long)
    responses = torch.full((n, max_response), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, max_prompt), dtype=torch.long)
    response_mask = torch.zeros((n, max_response), dtype=torch.long)
    answer_mask = torch.zeros((n, max_response), dtype=torch.long)
    for i, row in enumerate(rows):
        p, r = row["prompt_ids"], row["response_ids"]
        if p:
            prompts[i, max_prompt - len(p) :] = torch.tensor(p)
            prompt_mask[i, max_prompt - len(p) :] = 1
        if r:
            responses[i, : len(r)] = torch.tensor(r)
            response_mask[i, : len(r)] = 1
            answer_mask[i, : len(r)] = torch.tensor(row["answer_mask"])
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention,
            "position_ids": positions, "responses": responses, "answer_mask": answer_mask}
