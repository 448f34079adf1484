"""algorithm.rollout_correction.bypass_mode=true with loss_type=ppo_clip and a correction set (verl's bypass PPO-clip,
verl/algorithms/losses/bypass_ppo_clip.py): verl's two examples/rollout_correction scripts compose and skip the
old-log-prob pass, and the trainer's batch hook hands the settings to the update instead of correcting the batch."""

import torch

from verl.algorithms.losses.bypass_ppo_clip import BYPASS_PPO_CLIP
from verl.algorithms.losses.bypass_reinforce import BYPASS_REINFORCE
from verl.protocol import DataProto
from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.run_plan import old_log_prob_source

KEY = "algorithm.rollout_correction"
# What both scripts set besides the correction, without the data and model paths and the GPU count.
TRAINING = ["data.max_prompt_length=2048", "data.max_response_length=4096", "data.train_batch_size=128",
            "algorithm.gamma=1.0", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.ppo_epochs=1",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.rollout.name=vllm"]
# examples/rollout_correction/run_with_rollout_corr_multi_rs.sh: PPO-clip in bypass mode, token IS for the metrics,
# token_k1 and seq_max_k2 rejection.
MULTI_RS = TRAINING + [
    "algorithm.adv_estimator=grpo", f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold=2.0",
    f"{KEY}.rollout_is_batch_normalize=false", f"{KEY}.rollout_rs='token_k1,seq_max_k2'",
    f"{KEY}.rollout_rs_threshold='0.6_1.6,2.5'", f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=ppo_clip",
    "actor_rollout_ref.actor.optim.lr=3e-6", "trainer.logger=['console']",
    "trainer.project_name=rollout_corr_multi_rs_example", "trainer.experiment_name=ppo_clip_multi_rs",
    "trainer.total_epochs=5"]
# examples/rollout_correction/run_with_rollout_corr.sh: RLOO with self-normalised sequence IS, bypass REINFORCE.
RLOO = TRAINING + [
    "data.truncation=left", "algorithm.adv_estimator=rloo", f"{KEY}.rollout_is=sequence",
    f"{KEY}.rollout_is_threshold=2.0", f"{KEY}.rollout_is_batch_normalize=true", f"{KEY}.rollout_rs=null",
    f"{KEY}.rollout_rs_threshold=null", f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=reinforce",
    "actor_rollout_ref.actor.optim.lr=5e-7", "trainer.logger=['console','wandb']",
    "trainer.project_name=rollout_corr_rloo_example", "trainer.experiment_name=rloo_seq_is_pure",
    "trainer.total_epochs=10"]


def test_the_multi_rs_script_composes_and_takes_the_rollouts_log_probs():
    cfg = load_config(overrides=MULTI_RS)
    validate_ppo_config(cfg)
    section = cfg.algorithm.rollout_correction
    assert (section.loss_type, section.rollout_rs, section.rollout_rs_threshold) == (
        "ppo_clip", "token_k1,seq_max_k2", "0.6_1.6,2.5")
    assert old_log_prob_source(cfg, "vllm", "cuda") == "rollout"  # no old-log-prob pass


def test_the_rloo_script_composes_and_takes_the_rollouts_log_probs():
    cfg = load_config(overrides=RLOO)
    validate_ppo_config(cfg)
    assert cfg.algorithm.rollout_correction.loss_type == "reinforce"
    assert old_log_prob_source(cfg, "vllm", "cuda") == "rollout"


def _batch(source="rollout"):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    log_probs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    batch = DataProto.from_dict(tensors={"old_log_probs": log_probs, "rollout_log_probs": log_probs,
                                         "response_mask": mask})
    batch.meta_info["old_log_prob_source"] = source
    return batch


def test_the_hook_hands_the_scripts_settings_to_the_update():
    config = load_config(overrides=MULTI_RS).algorithm.rollout_correction
    batch, metrics = compute_rollout_correction_and_add_to_batch(_batch(), config)
    assert metrics == {} and "rollout_is_weights" not in batch.batch.keys()
    assert torch.equal(batch.batch["response_mask"], torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert BYPASS_REINFORCE not in batch.meta_info
    assert batch.meta_info[BYPASS_PPO_CLIP] == {
        "rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False,
        "rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "0.6_1.6,2.5", "rollout_rs_threshold_lower": None,
        "rollout_token_veto_threshold": None}


def test_bypass_ppo_clip_without_a_correction_keeps_loss_modes_loss():
    batch, metrics = compute_rollout_correction_and_add_to_batch(_batch(), {"bypass_mode": True})
    assert metrics == {} and BYPASS_PPO_CLIP not in batch.meta_info


def test_recomputed_old_log_probs_are_corrected_on_the_batch_as_before():
    batch, metrics = compute_rollout_correction_and_add_to_batch(_batch("recompute"), {"rollout_is": "token"})
    assert BYPASS_PPO_CLIP not in batch.meta_info and "rollout_is_weights" in batch.batch.keys()
    assert metrics["rollout_corr/rollout_is_mean"] == 1.0
