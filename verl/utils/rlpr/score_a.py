r"""ScoreA, RLPR's debiasing term: the policy's probability of the reference answer right after the prompt, with no
reasoning (the official code's online form, spec rlpr.md sec. 3):

    text   = chat_template(prompt, add_generation_prompt) + " " + y* + " " + EOS
    scoreA = agg(p(y* tokens | text before them))     at the rollout temperature, the same aggregation as scoreB

so that the reward max(0, scoreB - scoreA) credits what the reasoning added. Computed once, from the initial weights.
"""

from __future__ import annotations

import torch

from verl.utils.rlpr.scoring import aggregate


def score_a_text(prompt_text: str, reference: str, eos: str) -> tuple[str, tuple[int, int]]:
    """The scored text and the character span of y* in it."""
    start = len(prompt_text) + 1
    return f"{prompt_text} {reference} {eos}", (start, start + len(reference))


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
