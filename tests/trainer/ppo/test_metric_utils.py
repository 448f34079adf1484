"""How the workers' per-rank metric lists become one value per step (verl/trainer/ppo/metric_utils.py)."""

import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import compute_data_metrics, reduce_metrics
from verl.trainer.ppo.ray_trainer import _with_metrics


def test_lists_are_averaged_and_peak_memory_takes_the_largest_rank():
    reduced = reduce_metrics({"actor/pg_loss": [1.0, 2.0, 6.0], "memory/max_allocated_gib/update_actor": [3.5, 7.25],
                              "actor/empty": []})
    assert reduced == {"actor/pg_loss": 3.0, "memory/max_allocated_gib/update_actor": 7.25}


def test_a_worker_pass_hands_its_metrics_to_the_step_and_not_to_the_batch():
    output = DataProto(meta_info={"temperature": 1.0, "metrics": {"memory/max_allocated_gib/ref": [1.0, 2.0]}})
    metrics = {}
    assert _with_metrics(output, metrics).meta_info == {"temperature": 1.0}
    assert metrics == {"memory/max_allocated_gib/ref": 2.0}


def test_a_maximum_over_ranks_is_the_largest_and_a_minimum_the_smallest():
    # Two ranks' agent loops: the longest trajectory had 9 turns on one and 8 on the other (it logged 8.5).
    reduced = reduce_metrics({"agent/num_turns_max": [9.0, 8.0], "agent/num_turns_mean": [5.0, 4.0],
                              "x/min": [2.0, 1.0]})
    assert reduced == {"agent/num_turns_max": 9.0, "agent/num_turns_mean": 4.5, "x/min": 1.0}


def _tool_batch():
    """Two trajectories of a 6-token response window: the first cut at the limit (3 sampled, 2 tool, 1 sampled
    tokens), the second 2 sampled tokens long."""
    attended = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
    response_mask = torch.tensor([[1, 1, 1, 0, 0, 1], [1, 1, 0, 0, 0, 0]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    zeros = torch.zeros(2, 6)
    return DataProto.from_dict(
        tensors={"prompts": torch.zeros(2, 3, dtype=torch.long), "responses": torch.zeros(2, 6, dtype=torch.long),
                 "attention_mask": torch.cat([prompt_mask, attended], 1), "response_mask": response_mask,
                 "token_level_scores": zeros, "token_level_rewards": zeros, "advantages": zeros},
        non_tensors={"tool_calls": [1, 0], "num_turns": [4, 2]})


def test_response_length_counts_the_whole_response_as_verl_does():
    metrics = compute_data_metrics(_tool_batch())
    assert metrics["response_length/mean"] == 4.0 and metrics["response_length/max"] == 6.0
    assert metrics["response_length/clip_ratio"] == 0.5  # the first trajectory was cut at the limit
    assert (metrics["response_length_sampled/mean"], metrics["response_length_sampled/max"]) == (3.0, 4.0)
    assert (metrics["num_turns/min"], metrics["num_turns/max"], metrics["num_turns/mean"]) == (2.0, 4.0, 3.0)
    assert (metrics["prompt_length/mean"], metrics["prompt_length/min"]) == (2.5, 2.0)


def test_the_rollout_actor_gap_in_log_probs_and_in_verls_probabilities():
    import math

    batch = _tool_batch()
    old = torch.full((2, 6), math.log(0.5))
    rollout = old.clone()
    rollout[0, 0], rollout[1, 1] = math.log(0.25), math.log(0.75)  # two of the 6 masked tokens differ
    rollout[0, 3] = math.log(0.9)  # a tool token: out of the mask, not counted
    batch.batch["old_log_probs"], batch.batch["rollout_log_probs"] = old, rollout
    metrics = compute_data_metrics(batch)
    diffs = torch.tensor([0.25, 0, 0, 0, 0, 0.25])  # |p_rollout - p_old| over the 6 masked tokens
    assert metrics["training/rollout_probs_diff_max"] == 0.25
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(float(diffs.mean()))
    assert metrics["training/rollout_probs_diff_std"] == pytest.approx(float(diffs.std(unbiased=False)))
    assert metrics["training/rollout_actor_logprob_diff_max"] == pytest.approx(math.log(2))
    assert metrics["training/rollout_actor_logprob_diff_mean"] == pytest.approx(2 * math.log(2) / 6 * 0.5
                                                                              + math.log(1.5) / 6)
    # k3 with rho = p_old / p_rollout: 2 - 1 - log 2 for the first token, 2/3 - 1 - log(2/3) for the other
    assert metrics["training/rollout_k3_kl"] == pytest.approx(
        ((1 - math.log(2)) + (2 / 3 - 1 - math.log(2 / 3))) / 6)
    assert metrics["training/rollout_logprob_equal_frac"] == pytest.approx(4 / 6)
    assert metrics["training/rollout_gap_tokens"] == 6
    batch.meta_info["old_log_prob_source"] = "rollout"  # compared with themselves: nothing to measure
    assert "training/rollout_probs_diff_max" not in compute_data_metrics(batch)


def test_gap_sums_of_micro_batches_and_ranks_add_up_to_the_whole_batchs_metrics():
    """Workers return the gap as sums per micro-batch (verl/utils/rollout_gap.py); the driver adds them up, so the
    metrics equal those of the whole batch at once, std and max included, not a mean of per-rank means."""
    from verl.utils.rollout_gap import gap_metrics, gap_sums, pop_worker_sums, worker_metrics

    torch.manual_seed(0)
    rollout = torch.randn(6, 5).clamp(max=0) - 0.1
    actor = rollout + 0.05 * torch.randn(6, 5)
    actor[0, :2] = rollout[0, :2]  # bit-equal tokens
    mask = torch.ones(6, 5)
    mask[2, 3:] = 0
    whole = gap_metrics(gap_sums(rollout, actor, mask))
    metrics = {"actor/pg_loss": [0.1, 0.2]}
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):  # three micro-batches over two "ranks"
        for key, values in worker_metrics(gap_sums(rollout[rows], actor[rows], mask[rows])).items():
            metrics.setdefault(key, []).extend(values)
    parts = gap_metrics(pop_worker_sums(metrics))
    assert set(metrics) == {"actor/pg_loss"}  # the sums left the worker's metrics
    assert parts.keys() == whole.keys()
    for key in whole:
        assert parts[key] == pytest.approx(whole[key], rel=1e-9), key
    assert whole["training/rollout_logprob_equal_frac"] == pytest.approx(2 / 28)
    assert whole["training/rollout_gap_tokens"] == 28
    assert gap_metrics(gap_sums(rollout, actor, torch.zeros(6, 5))) == {}
    assert pop_worker_sums({"actor/pg_loss": [0.1]}) is None
