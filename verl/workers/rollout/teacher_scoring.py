"""A distillation teacher served by a rollout engine (`distillation.teacher_models.<name>.inference.name=hf|vllm`):
the rows of a rollout batch as the engine's sequences, and its prompt log-probs (`RolloutEngine.score`) laid back out
as the batch's response columns.

A row of the batch is `input_ids` = left-padded prompt + right-padded response, `attention_mask` 1 on every real token
(tool results inside a multi-turn response too). The engine scores the row's real tokens as one sequence; the log-prob
of response position j is the score of the token at prompt_length + j given all before it, which is the last
`response tokens` entries of the sequence's scores. Positions past the response (padding) stay 0, as the FSDP
teacher's do under the response mask.
"""

from __future__ import annotations

import torch

from verl.workers.rollout.base import RolloutEngine

COLUMNS = ("teacher_log_probs", "teacher_topk_log_probs", "teacher_topk_ids")


def engine_teacher_log_probs(engine: RolloutEngine, data, rows: torch.Tensor, temperature: float,
                             topk: int = 0) -> dict[str, torch.Tensor]:
    """`teacher_log_probs` `(bs, response_len)` (and with `topk` the `(bs, response_len, topk)` top-k columns) of the
    rows of `data` where `rows` is True, scored by `engine` at `temperature`; the other rows are 0."""
    input_ids, mask, responses = (data.batch[key] for key in ("input_ids", "attention_mask", "responses"))
    batch, width = responses.shape
    prompt = input_ids.shape[1] - width
    wanted = rows.nonzero().squeeze(1).tolist()
    lengths = mask[:, prompt:].sum(dim=1).tolist()
    sequences = [input_ids[i][mask[i].bool()].tolist() for i in wanted]
    out = {COLUMNS[0]: torch.zeros(batch, width, dtype=torch.float32)}
    if topk:
        out[COLUMNS[1]] = torch.zeros(batch, width, topk, dtype=torch.float32)
        out[COLUMNS[2]] = torch.zeros(batch, width, topk, dtype=torch.long)
    for i, scored in zip(wanted, engine.score(sequences, temperature=temperature, topk=topk) if wanted else ()):
        n = int(lengths[i])
        if n == 0:
            continue
        out[COLUMNS[0]][i, :n] = scored.log_probs[-n:].float()
        if topk:
            out[COLUMNS[1]][i, :n] = scored.topk_log_probs[-n:].float()
            out[COLUMNS[2]][i, :n] = scored.topk_ids[-n:].long()
    device = responses.device
    return {key: value.to(device) for key, value in out.items()}
