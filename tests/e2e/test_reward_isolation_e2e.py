"""End to end: a reward function that returns NaN for a third of the samples no longer silently turns training off
(each such sample scores 0, is counted, the run trains on), and one that fails for every sample stops the run naming
trainer.max_bad_reward_fraction."""

import math
import os

import pytest
from e2e_utils import DIGIT_REWARD, build_trainer, tiny_overrides

from verl.trainer.ppo.guards import TrainingStopped

pytestmark = pytest.mark.e2e

NAN_THIRD = os.path.join(os.path.dirname(__file__), "nan_third_reward.py")


def test_nan_rewards_are_isolated_and_rewards_that_all_fail_stop_the_run(
    ray_session, tiny_model_dir, arithmetic_data_dir, tmp_path, capsys
):
    overrides = [o.replace(DIGIT_REWARD, NAN_THIRD) for o in tiny_overrides(tiny_model_dir, arithmetic_data_dir)]
    trainer = build_trainer(
        [*overrides, "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}"], tiny_model_dir
    )
    try:
        before = trainer.actor_rollout_wg.weight_fingerprint()
        history = trainer.fit()
        after = trainer.actor_rollout_wg.weight_fingerprint()
        # every call of the 32 of a step with a running count divisible by 3 is NaN: calls 3..30, then 33..63
        for metrics, failed in zip(history, (10, 11)):
            assert metrics["reward/status/non_finite"] == pytest.approx(failed / 32)
            assert metrics["reward/status/ok"] == pytest.approx(1 - failed / 32)
            assert metrics["reward/failed_fraction"] == pytest.approx(failed / 32)
            assert math.isfinite(metrics["critic/score/mean"]) and math.isfinite(metrics["actor/grad_norm"])
            assert metrics["actor/skipped_steps"] == 0
        assert before != after  # the updates were taken
        printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[reward]")]
        assert (
            len(printed) == 1
            and f"compute_score ({NAN_THIRD}) failed on a sample of data source 'arithmetic'" in (printed[0])
            and ": returned nan." in printed[0]
        )

        trainer.reward_fn.compute_score = lambda **sample: "correct"  # a string for every sample
        with pytest.raises(TrainingStopped) as stop:
            trainer._step(trainer._prompt_batches(), {}, {})
        assert str(stop.value).startswith(
            "step 2: grading failed for 100% of the samples (not_a_number 100%), more "
            "than trainer.max_bad_reward_fraction=0.5."
        )
    finally:
        trainer.shutdown()
