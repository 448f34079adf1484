"""End to end: GRPO rewarded by a reward model (reward_model.enable=true, the tiny sequence-classification model),
2 FSDP ranks on CPU. The trainer scores each batch with the reward-model worker group, and the reward manager takes
its `rm_scores` as the reward; with a custom_reward_function the function grades, reading the RM's score."""

import math

import pytest
import torch
from e2e_utils import fit_trainer, tiny_overrides

pytestmark = pytest.mark.e2e

# A rule that gives every response 1, plus the reward model's score.
RULE_PLUS_RM = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 + extra_info["rm_score"]
'''


def reward_model_overrides(model_dir, data_dir, rm_dir, run_dir, *extra):
    return tiny_overrides(model_dir, data_dir, "custom_reward_function.path=null", "reward_model.enable=true",
                          f"reward_model.model.path={rm_dir}", "reward_model.micro_batch_size_per_gpu=4",
                          "trainer.total_training_steps=2", f"trainer.default_local_dir={run_dir}", *extra)


def direct_scores(rm_dir, batch) -> torch.Tensor:
    """Each row's score by a plain forward of the reward model on its prompt + response tokens, read on the last one
    (the RM shares the policy's tokenizer, so it reads the policy's tokens)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(rm_dir)
    scores = []
    with torch.no_grad():
        for ids, mask in zip(batch.batch["input_ids"], batch.batch["attention_mask"]):
            hidden = model.model(input_ids=ids[mask.bool()][None]).last_hidden_state
            scores.append(model.score(hidden)[0, -1, 0].item())
    return torch.tensor(scores)


@pytest.fixture(scope="module")
def rm_run(ray_session, tiny_model_dir, arithmetic_data_dir, tiny_reward_model_dir, tmp_path_factory):
    overrides = reward_model_overrides(tiny_model_dir, arithmetic_data_dir, tiny_reward_model_dir,
                                       tmp_path_factory.mktemp("rm_run"))
    _, history, before, after, batch = fit_trainer(overrides, tiny_model_dir, probe_step=True)
    return {"history": history, "before": before, "after": after, "batch": batch}


def test_two_steps_train_on_the_reward_models_scores(rm_run):
    history = rm_run["history"]
    assert [m["training/global_step"] for m in history] == [1, 2]
    for metrics in history:
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
            assert math.isfinite(metrics[key]), (key, metrics[key])
        assert metrics["critic/score/std"] > 0  # the RM's scores differ within groups: GRPO has a signal
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(rm_run["after"], rm_run["before"]))


def test_the_scores_are_the_reward_models(rm_run, tiny_reward_model_dir):
    batch = rm_run["batch"]
    rm_scores, scores = batch.batch["rm_scores"], batch.batch["token_level_scores"]
    torch.testing.assert_close(scores, rm_scores)  # no rule graded, no penalty
    per_row = scores.sum(-1)
    assert (per_row != 0).all() and not set(per_row.tolist()) <= {0.0, 1.0}  # real-valued, not a rule's 0/1
    assert ((scores != 0).sum(-1) == 1).all()  # one score per response
    response_mask = batch.batch["attention_mask"][:, batch.batch["prompts"].shape[-1]:]
    last = (response_mask * torch.arange(response_mask.shape[-1])).argmax(-1)
    torch.testing.assert_close(scores[torch.arange(len(batch)), last], per_row)  # on the last response token
    torch.testing.assert_close(per_row, direct_scores(tiny_reward_model_dir, batch), rtol=1e-4, atol=1e-4)
    assert batch.non_tensor_batch["rm_score"].tolist() == pytest.approx(per_row.tolist())


def test_a_custom_function_combines_its_rule_with_the_rm_score(ray_session, tiny_model_dir, arithmetic_data_dir,
                                                               tiny_reward_model_dir, tmp_path):
    reward_file = tmp_path / "rule_plus_rm.py"
    reward_file.write_text(RULE_PLUS_RM)
    overrides = reward_model_overrides(tiny_model_dir, arithmetic_data_dir, tiny_reward_model_dir, tmp_path / "run",
                                       f"custom_reward_function.path={reward_file}", "trainer.total_training_steps=1")
    _, history, _, _, batch = fit_trainer(overrides, tiny_model_dir, probe_step=True)
    assert math.isfinite(history[0]["actor/pg_loss"])
    torch.testing.assert_close(batch.batch["token_level_scores"].sum(-1), 1.0 + batch.batch["rm_scores"].sum(-1))
