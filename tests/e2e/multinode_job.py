"""Run by test_multinode.py: a Ray cluster of two simulated nodes on this machine (Ray's own test utility), and a
2-step GRPO job that attaches to it through RAY_ADDRESS with trainer.nnodes=2 trainer.n_gpus_per_node=1."""

import json
import os
import subprocess
import sys

from ray.cluster_utils import Cluster


def main(model_dir: str, data_dir: str, out_dir: str) -> int:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    try:
        env = {**os.environ, "RAY_ADDRESS": cluster.address}
        command = [sys.executable, "-m", "verl.trainer.main_ppo", f"actor_rollout_ref.model.path={model_dir}",
                   f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
                   "data.train_batch_size=4", "data.max_prompt_length=64", "data.max_response_length=8",
                   "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                   "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
                   "trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.logger=[console]",
                   f"trainer.default_local_dir={out_dir}"]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        print(json.dumps({"returncode": result.returncode, "stdout": result.stdout[-6000:],
                          "stderr": result.stderr[-6000:], "nodes": len(cluster.list_all_nodes())}))
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
