r"""ScoreA, RLPR's debiasing term: the policy's probability of the reference answer right after the prompt, with no
reasoning (the form the official RLPR implementation computes online, before training):

    text   = chat_template(prompt, add_generation_prompt) + " " + y* + " " + EOS
    scoreA = agg(p(y* tokens | text before them))     at the rollout temperature, the same aggregation as scoreB

so that the reward max(0, scoreB - scoreA) credits what the reasoning added. Computed once, from the initial weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm import tqdm

from verl.protocol import DataProto
from verl.workers.reward_manager.rlpr.scoring import aggregate
from verl.workers.reward_manager.rlpr.splice import Spliced, build_pr_batch, tokenize_spliced


def score_a_text(prompt_text: str, reference: str, eos: str) -> tuple[str, tuple[int, int]]:
    """The scored text and the character span of y* in it."""
    start = len(prompt_text) + 1
    return f"{prompt_text} {reference} {eos}", (start, start + len(reference))


def score_a_key(prompt_text: str, reference: str) -> str:
    """Key of a (prompt, reference answer) pair in the table of scoreA computed online (the official code's)."""
    return f"{prompt_text}\n\n\n{reference}"


def score_a_table(dataset, tokenizer, log_prob_fn: Callable[[DataProto], torch.Tensor], aggregation: str,
                  max_prompt_length: int, max_response_length: int, chunk_size: int = 64) -> dict[str, float]:
    """`score_a_key(prompt, y*) -> scoreA` for every item of an RL dataset (`raw_prompt_ids`, `reward_model`), scored
    by `log_prob_fn` (the actor's log-prob pass: a batch with `responses` -> `(bs, response_len)` log-probs).

    The text before y* is the prompt part of each row and y* + " " + EOS its response part, so the actor's usual
    prompt/response batch layout scores it; `chunk_size` rows go to `log_prob_fn` at a time.
    """
    rows, keys = [], []
    for i in tqdm(range(len(dataset)), desc="scoreA (initial weights)", unit="prompt"):
        item = dataset[i]
        prompt = tokenizer.decode(item["raw_prompt_ids"])
        truth = str(item["reward_model"]["ground_truth"])
        text, span = score_a_text(prompt, truth, tokenizer.eos_token)
        rows.append(tokenize_spliced(Spliced(text, len(prompt), span, True), tokenizer, max_prompt_length,
                                     max_response_length))
        keys.append(score_a_key(prompt, truth))
    table: dict[str, float] = {}
    for start in range(0, len(rows), chunk_size):
        tensors = build_pr_batch(rows[start : start + chunk_size], tokenizer.pad_token_id, max_prompt_length,
                                 max_response_length)
        mask = tensors.pop("answer_mask")
        log_probs = log_prob_fn(DataProto.from_dict(tensors=tensors))
        for key, score in zip(keys[start : start + chunk_size], aggregate(log_probs.cpu(), mask, aggregation)):
            table[key] = float(score)
    return table


@torch.no_grad()
def compute_score_a(model, tokenizer, prompt_texts: list[str], references: list[str],
                    aggregation: str = "mean_exp_log_softmax", temperature: float = 1.0,
                    batch_size: int = 8, device: str = "cpu") -> list[float]:
    """scoreA of each (templated prompt, y*) pair; batches are right padded, y* tokens found by character offsets."""
    scores: list[float] = []
    model.eval()
    for start in range(0, len(prompt_texts), batch_size):
        rows = []
        for prompt, reference in zip(prompt_texts[start : start + batch_size], references[start : start + batch_size]):
            text, (lo, hi) = score_a_text(prompt, reference, tokenizer.eos_token)
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            mask = [int(a < hi and b > lo) for a, b in encoded["offset_mapping"]]
            rows.append((encoded["input_ids"], mask))
        width = max(len(ids) for ids, _ in rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows], device=device)
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows], device=device)
        answer = torch.tensor([m + [0] * (width - len(m)) for _, m in rows], device=device)
        logits = model(input_ids=input_ids, attention_mask=attention).logits.float() / temperature
        # Token t is predicted at position t - 1: score positions 1..width-1.
        log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        scores.extend(aggregate(log_probs.cpu(), answer[:, 1:].cpu(), aggregation).tolist())
    return scores
