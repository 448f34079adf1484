"""verl/workers/rollout/teacher_scoring.py: a rollout batch's rows scored by an engine teacher (HFRollout.score) land
in the response columns where the teacher's forward over the padded rows puts them."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.protocol import DataProto
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.teacher_scoring import engine_teacher_log_probs


def rollout_batch(pad: int):
    """Three rows: left-padded prompts of 3, 5 and 2 tokens, right-padded responses of 4, 1 and 0 tokens."""
    prompts, responses = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]], [[20, 21, 22, 23], [24], []]
    p, r = 5, 4
    input_ids = torch.full((3, p + r), pad)
    mask = torch.zeros(3, p + r, dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        input_ids[i, p - len(prompt):p] = torch.tensor(prompt)
        input_ids[i, p:p + len(response)] = torch.tensor(response, dtype=torch.long)
        mask[i, p - len(prompt):p + len(response)] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={"input_ids": input_ids, "attention_mask": mask, "position_ids": positions,
                                        "responses": input_ids[:, p:]}), responses


def test_engine_scores_are_the_forward_over_the_padded_rows(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    engine = HFRollout(model, tokenizer, {"micro_batch_size": 2}, static_decode=False)
    data, responses = rollout_batch(engine.pad_token_id)
    out = engine_teacher_log_probs(engine, data, torch.tensor([True, True, True]), temperature=0.8, topk=3)
    with torch.no_grad():
        logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                       position_ids=data.batch["position_ids"]).logits[:, -5:-1]
    expected = torch.log_softmax(logits.float() / 0.8, -1)
    for i, response in enumerate(responses):
        n = len(response)
        taken = expected[i, :n].gather(-1, data.batch["responses"][i, :n, None]).squeeze(-1)
        torch.testing.assert_close(out["teacher_log_probs"][i, :n], taken, atol=1e-5, rtol=0)
        top = expected[i, :n].topk(3, dim=-1)
        torch.testing.assert_close(out["teacher_topk_log_probs"][i, :n], top.values, atol=1e-5, rtol=0)
        assert torch.equal(out["teacher_topk_ids"][i, :n], top.indices)
        assert not out["teacher_log_probs"][i, n:].any() and not out["teacher_topk_ids"][i, n:].any()
    # Only the rows asked for are scored; the others stay 0 (another teacher's).
    only = engine_teacher_log_probs(engine, data, torch.tensor([False, True, False]), temperature=0.8)
    assert set(only) == {"teacher_log_probs"} and not only["teacher_log_probs"][[0, 2]].any()
    # Row 1 alone is a forward of another shape (one row of 6 tokens, not two of 7) than in the micro-batch with row
    # 0: HFRollout.score is not batch-invariant (exact mode is), so its bits may differ by rounding (4.8e-7 on an AMD
    # EPYC, bit-equal on the machines before). Its score is still row 1's, within the forward's tolerance above.
    torch.testing.assert_close(only["teacher_log_probs"][1], out["teacher_log_probs"][1], atol=1e-5, rtol=0)
