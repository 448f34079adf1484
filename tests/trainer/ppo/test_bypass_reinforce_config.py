"""algorithm.rollout_correction.loss_type=reinforce: the key composes with bypass_mode=true and the corrections (which
its loss applies), bad values are refused naming the key, and the trainer's batch hook hands the settings to the
update instead of correcting the batch."""

import pytest
import torch

from verl.algorithms.losses.bypass_reinforce import BYPASS_REINFORCE
from verl.protocol import DataProto
from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.run_plan import old_log_prob_source
from verl.utils.config import ConfigError

KEY = "algorithm.rollout_correction"
# verl's examples/rollout_correction RLOO script: sequence TIS, self-normalised, bypass REINFORCE.
VERL_EXAMPLE = [f"{KEY}.rollout_is=sequence", f"{KEY}.rollout_is_threshold=2.0",
                f"{KEY}.rollout_is_batch_normalize=true", f"{KEY}.rollout_rs=null", f"{KEY}.rollout_rs_threshold=null",
                f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=reinforce", "algorithm.adv_estimator=rloo"]


def test_verl_example_composes_and_takes_the_rollouts_log_probs():
    cfg = load_config(overrides=VERL_EXAMPLE)
    validate_ppo_config(cfg)
    assert cfg.algorithm.rollout_correction.loss_type == "reinforce"
    assert old_log_prob_source(cfg, "hf", "cpu") == "rollout"  # no old-log-prob pass


def test_rejection_composes_with_bypass_reinforce():
    validate_ppo_config(load_config(overrides=[f"{KEY}.bypass_mode=true", f"{KEY}.loss_type=reinforce",
                                               f"{KEY}.rollout_is=token", f"{KEY}.rollout_rs='token_k1,seq_max_k2'",
                                               f"{KEY}.rollout_rs_threshold='0.6_1.6,2.5'"]))


@pytest.mark.parametrize("overrides, message", [
    ([f"{KEY}.loss_type=a2c"], f"{KEY}.loss_type='a2c' must be ppo_clip"),
    ([f"{KEY}.loss_type=reinforce"], f"{KEY}.loss_type=reinforce is the loss of bypass mode.*bypass_mode=auto"),
    ([f"{KEY}.loss_type=reinforce", f"{KEY}.bypass_mode=false"], "but bypass_mode=False; set bypass_mode=true"),
])
def test_bad_values_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_ppo_config(load_config(overrides=overrides))


def _batch(source):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    log_probs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    batch = DataProto.from_dict(tensors={"old_log_probs": log_probs, "rollout_log_probs": log_probs,
                                         "response_mask": mask})
    batch.meta_info["old_log_prob_source"] = source
    return batch


def test_the_hook_hands_the_settings_to_the_update():
    config = {"bypass_mode": True, "loss_type": "reinforce", "rollout_is": "sequence",
              "rollout_is_batch_normalize": True}
    batch, metrics = compute_rollout_correction_and_add_to_batch(_batch("rollout"), config)
    assert metrics == {} and "rollout_is_weights" not in batch.batch.keys()
    assert torch.equal(batch.batch["response_mask"], torch.tensor([[1, 1, 0], [1, 0, 0]]))
    # The keys the loss reads; those the config leaves out take ppo_trainer.yaml's defaults.
    assert batch.meta_info[BYPASS_REINFORCE] == {
        "rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True, "rollout_rs": None,
        "rollout_rs_threshold": None, "rollout_rs_threshold_lower": None, "rollout_token_veto_threshold": None}


def test_the_hook_refuses_reinforce_on_recomputed_old_log_probs():
    with pytest.raises(ValueError, match=f"{KEY}.loss_type=reinforce is the bypass-mode loss.*'recompute'"):
        compute_rollout_correction_and_add_to_batch(_batch("recompute"), {"loss_type": "reinforce"})
