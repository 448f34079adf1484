"""How the workers' per-rank metric lists become one value per step (verl/trainer/ppo/metric_utils.py)."""

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import reduce_metrics
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
