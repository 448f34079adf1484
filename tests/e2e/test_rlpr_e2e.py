"""End to end on CPU: RLPR's probability reward scores responses with the current actor, and GRPO trains on it."""

import json
import math
from collections import defaultdict

import pandas as pd
import pytest
import torch
from e2e_utils import build_trainer, fit_trainer, prime_model, tiny_overrides

from verl.workers.reward_manager.rlpr.score_a import compute_score_a, score_a_key
from verl.workers.reward_manager.rlpr.splice import splice_reference

pytestmark = pytest.mark.e2e

PROB = ["reward_model.reward_manager=prob", "reward_model.val_reward_manager=naive", "reward_model.format_mode=R1",
        "reward_model.compute_score_name=mean_exp_log_softmax",
        "reward_model.reward_manager_shaping_function_name=threshold_0", "custom_reward_function.path=null",
        "data.max_response_length=32", "actor_rollout_ref.rollout.temperature=1.0"]


@pytest.fixture(scope="module")
def r1_model(tiny_model_dir, arithmetic_data_dir, tmp_path_factory):
    """The tiny model after a seconds-long cold start on R1-format answers to the arithmetic questions."""
    rows = pd.read_parquet(f"{arithmetic_data_dir}/train.parquet").head(64)
    conversations = [(list(p), f"<think>I add.</think><answer>{rm['ground_truth']}</answer>")
                     for p, rm in zip(rows["prompt"], rows["reward_model"])]
    out = str(tmp_path_factory.mktemp("r1_model"))
    prime_model(tiny_model_dir, out, conversations, steps=150)
    return out


def test_score_b_is_the_reference_probability_under_the_actor(ray_session, r1_model, arithmetic_data_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    overrides = tiny_overrides(r1_model, arithmetic_data_dir, *PROB, f"trainer.default_local_dir={tmp_path}")
    trainer = build_trainer(overrides, r1_model)
    try:
        batch, _ = trainer._rollout_and_score(next(trainer._prompt_batches()), defaultdict(list), {})
    finally:
        trainer.shutdown()
    tokenizer = AutoTokenizer.from_pretrained(r1_model)
    model = AutoModelForCausalLM.from_pretrained(r1_model).eval()
    prompt_len = batch.batch["prompts"].shape[1]
    checked = 0
    for i in range(len(batch)):
        mask = batch.batch["attention_mask"][i].bool()
        ids = batch.batch["input_ids"][i]
        prompt = tokenizer.decode(ids[:prompt_len][mask[:prompt_len]])
        response = tokenizer.decode(ids[prompt_len:][mask[prompt_len:]])
        response = response if response.endswith(tokenizer.eos_token) else response + tokenizer.eos_token
        truth = batch.non_tensor_batch["reward_model"][i]["ground_truth"]
        spliced = splice_reference(prompt, response, truth, tokenizer.eos_token)
        if not spliced.valid:
            assert batch.non_tensor_batch["scoreB"][i] == 0.0
            continue
        encoded = tokenizer(spliced.text, add_special_tokens=False, return_offsets_mapping=True)
        token_ids = torch.tensor(encoded["input_ids"])
        lo, hi = spliced.answer_span
        targets = [k for k, (a, b) in enumerate(encoded["offset_mapping"]) if a < hi and b > lo]
        with torch.no_grad():
            probs = torch.softmax(model(token_ids[None]).logits[0].float() / 1.0, dim=-1)
        direct = float(torch.stack([probs[k - 1, token_ids[k]] for k in targets]).mean())
        assert batch.non_tensor_batch["scoreB"][i] == pytest.approx(direct, abs=1e-4)
        checked += 1
    assert checked >= 4  # the cold-started model answers in the R1 format often enough


def test_rlpr_trains_three_steps_with_the_ema_std_filter(ray_session, r1_model, arithmetic_data_dir, tmp_path):
    """Step 1 warms the EMA up; steps 2 and 3 keep groups with std >= 0.5 * E and regenerate to fill the batch;
    rewards are debiased by scoreA computed online at the start."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    overrides = tiny_overrides(r1_model, arithmetic_data_dir, *PROB, "reward_model.repetition_penalty=true",
                               "algorithm.filter_mode=ema_std", "algorithm.filter_ema_start_step=1",
                               "algorithm.filter_start_step=2", "algorithm.std_filter_beta=0.5",
                               "reward_model.use_debiasing=true", "reward_model.compute_scoreA_online=true",
                               f"trainer.default_local_dir={tmp_path}")
    trainer, history, before, after, _ = fit_trainer(overrides, r1_model)
    # scoreA was computed once, with the initial weights, for every training prompt: as tools/compute_scoreA.py does.
    table = json.loads((tmp_path / "scoreA.json").read_text())
    assert len(table) == len(trainer.train_dataset)
    tokenizer = AutoTokenizer.from_pretrained(r1_model)
    item = trainer.train_dataset[0]
    prompt, truth = tokenizer.decode(item["raw_prompt_ids"]), str(item["reward_model"]["ground_truth"])
    offline = compute_score_a(AutoModelForCausalLM.from_pretrained(r1_model), tokenizer, [prompt], [truth])[0]
    assert table[score_a_key(prompt, truth)] == pytest.approx(offline, abs=1e-4)
    assert [m["training/global_step"] for m in history] == [1, 2, 3]
    assert math.isnan(history[0]["batch/std_threshold"]) and history[0]["batch/std_mean"] > 0
    for m in history[1:]:
        assert m["batch/std_threshold"] > 0 and m["batch/num_gen_batches"] >= 1
        assert m["batch/std_kept_groups"] + m["batch/std_dropped_groups"] == 8 * m["batch/num_gen_batches"]
        assert m["batch/valid"] == 32  # refilled to data.train_batch_size groups of n=4
    # E after step 2 folds in step 2's mean std: the threshold moves between steps.
    assert history[2]["batch/std_threshold"] != history[1]["batch/std_threshold"]
    assert trainer.batch_filter.filters["ema_std"].std_filter.ema is not None
    for m in history:
        for key in ("actor/pg_loss", "actor/grad_norm", "rlpr/scoreB_mean", "rlpr/valid_fraction"):
            assert math.isfinite(m[key]), (key, m)
        assert 0 <= m["rlpr/scoreB_mean"] <= 1
    assert max(m["rlpr/valid_fraction"] for m in history) > 0
    assert max(m["critic/score/std"] for m in history) > 0  # the probability reward separates responses
    assert all(abs(a["actor"] - b["actor"]) > 1e-6 for a, b in zip(after, before))


def test_rlpr_with_lora_trains_adapters_only(ray_session, r1_model, arithmetic_data_dir, tmp_path):
    """LoRA: 3 RLPR steps; the base weights stay, the reference policy is the base model, and the merger writes
    base + adapter (checked against peft loading the exported adapter)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from verl.model_merger import merge_checkpoint
    from verl.model_merger.fsdp_model_merger import merged_state

    overrides = tiny_overrides(r1_model, arithmetic_data_dir, *PROB, "actor_rollout_ref.model.lora_rank=8",
                               "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.actor.optim.lr=1e-2",
                               "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.01",
                               "trainer.save_freq=3", f"trainer.default_local_dir={tmp_path}")
    _, history, _, _, batch = fit_trainer(overrides, r1_model, probe_step=True)
    assert [m["training/global_step"] for m in history] == [1, 2, 3]
    assert all(math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/kl_loss"]) for m in history)
    # The rollout engine samples with the merged weights: its log-probs match the adapted actor's after each sync.
    assert all(m["training/rollout_actor_logprob_diff_max"] < 1e-3 for m in history)

    base = AutoModelForCausalLM.from_pretrained(r1_model).eval()
    actor_dir = tmp_path / "global_step_3" / "actor"
    state, _ = merged_state(str(actor_dir))
    base_state = base.state_dict()
    changed = []
    for name, tensor in state.items():
        hf_name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        if "lora_" in name:
            changed.append(name)
        else:
            assert torch.equal(tensor, base_state[hf_name]), name  # frozen
    assert any(state[n].abs().sum() > 0 for n in changed if "lora_B" in n)  # the adapters moved off zero

    # The reference log-probs are the base model's.
    prompt_len = batch.batch["prompts"].shape[1]
    row = 0
    mask = batch.batch["attention_mask"][row].bool()
    ids = batch.batch["input_ids"][row][mask]
    n_resp = int(mask[prompt_len:].sum())
    with torch.no_grad():
        logits = base(ids[None]).logits[0].float()
    direct = torch.log_softmax(logits[-n_resp - 1 : -1], dim=-1).gather(-1, ids[-n_resp:, None]).squeeze(-1)
    assert torch.allclose(batch.batch["ref_log_prob"][row, :n_resp], direct, atol=1e-4)

    target = tmp_path / "merged"
    merge_checkpoint(str(actor_dir), str(target), lora_adapter=True)
    merged = AutoModelForCausalLM.from_pretrained(target).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(r1_model), str(target / "lora_adapter"))
    probe = torch.randint(3, 500, (2, 10))
    with torch.no_grad():
        assert torch.allclose(merged(probe).logits, adapted.eval()(probe).logits, atol=1e-5)
        assert not torch.allclose(merged(probe).logits, base(probe).logits, atol=1e-4)
