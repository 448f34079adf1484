"""A PPO run's topology, the first thing its plan decides: the device, the ranks and the rollout engine.

The config check (`config_rules.validate_ppo_config`) runs its rank rules (batch sizes split over the ranks, Ulysses
groups dividing them, the engine's own settings) against this topology, and the plan (`run_plan.plan_run`) is built
on it, so both read one decision:

    ranks per node   trainer.n_gpus_per_node on GPUs; on CPU trainer.cpu_ranks_per_node, null = one rank with all
                     the cores for an actor of ONE_CPU_RANK_MIN_PARAMETERS or more on one node (unless Ulysses
                     groups need the ranks), else n_gpus_per_node
    ranks            trainer.nnodes x ranks per node
    rollout engine   rollout.name, with auto resolved (verl/workers/rollout/selection.py): vLLM on CUDA where it is
                     installed, on CPU for a large actor its CPU build can run, else the HF engine
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from verl.utils.config import ConfigError

# trainer.cpu_ranks_per_node=null runs one rank per CPU node, using all its cores, from this many actor parameters on
# (benchmarks/README.md, "Issue 27 (2026-11-26): one CPU rank with both cores at
# the 0.5B shape").
ONE_CPU_RANK_MIN_PARAMETERS = 50_000_000


@dataclasses.dataclass(frozen=True)
class Topology:
    device: str  # cpu | cuda
    nnodes: int
    ranks_per_node: int
    n_ranks: int
    # Ulysses sequence parallelism (ulysses_sequence_parallel_size): groups of this many consecutive ranks hold the
    # same sequences and split each along its length; the critic has its own size.
    sequence_parallel: int
    critic_sequence_parallel: int
    rollout_engine: str  # hf | vllm | sglang | trtllm | openai | a user's registered engine
    cpu_ranks_per_node: int | None = None  # the key that set the ranks on CPU, for messages

    def ranks_phrase(self) -> str:
        """The ranks and the keys that set them, for a rule's message ("... must be divisible by <this>")."""
        if self.cpu_ranks_per_node is not None and self.device == "cpu":
            return (f"the {self.n_ranks} ranks of trainer.cpu_ranks_per_node={self.cpu_ranks_per_node} x "
                    f"trainer.nnodes={self.nnodes}")
        return f"the number of ranks {self.n_ranks} (trainer.nnodes * trainer.n_gpus_per_node)"


def sequence_parallel_sizes(config: DictConfig) -> tuple[int, int]:
    """(the actor's and reference's Ulysses group size, the critic's): ulysses_sequence_parallel_size. The reference
    runs on the actor's ranks with the actor's groups, so its size must be the actor's (verl's default
    interpolates it so)."""
    arr = config.actor_rollout_ref
    sp, ref_sp = arr.actor.ulysses_sequence_parallel_size, arr.ref.ulysses_sequence_parallel_size
    if ref_sp != sp:
        raise ConfigError(f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={ref_sp} must equal "
                          f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}: the reference model runs on "
                          "the actor's ranks, in the actor's sequence-parallel groups")
    return sp, config.critic.ulysses_sequence_parallel_size


def ranks_per_node(trainer, device: str, actor_parameters: int | None, sequence_parallel: int = 1) -> int:
    """Ranks on each node (the module docstring's rule)."""
    if device != "cpu":
        return trainer.n_gpus_per_node
    if trainer.cpu_ranks_per_node is not None:
        return trainer.cpu_ranks_per_node
    if trainer.nnodes == 1 and sequence_parallel == 1 and (actor_parameters or 0) >= ONE_CPU_RANK_MIN_PARAMETERS:
        return 1
    return trainer.n_gpus_per_node


def vllm_config_problems(rollout, model_path, device: str, ranks: int, prefix: str) -> list[str]:
    """What stops vLLM from running this rollout config (verl/workers/rollout/vllm_rollout.py; imported only when
    vLLM is a candidate, since the import sets vLLM's environment)."""
    from verl.workers.rollout.vllm_rollout import config_problems

    return config_problems(rollout, model_path, device, ranks, prefix)


def plan_topology(config: DictConfig, device: str, actor_parameters: int | None = None) -> Topology:
    """The topology of a ppo_trainer config on `device` (resolved: cpu or cuda). `actor_parameters` (from the model's
    config.json) decides what depends on the model's size on CPU: the ranks per node and the engine of
    rollout.name=auto."""
    from verl.workers.rollout.selection import resolve_rollout_name

    trainer, arr = config.trainer, config.actor_rollout_ref
    sp, critic_sp = sequence_parallel_sizes(config)
    per_node = ranks_per_node(trainer, device, actor_parameters, max(sp, critic_sp))
    ranks, rollout = trainer.nnodes * per_node, arr.rollout
    engine = resolve_rollout_name(rollout.name, device, actor_parameters,
                                  vllm_problems=lambda: vllm_config_problems(rollout, arr.model.path, device, ranks,
                                                                             "actor_rollout_ref.rollout"),
                                  tensor_parallel=rollout.tensor_model_parallel_size)
    return Topology(device=device, nnodes=trainer.nnodes, ranks_per_node=per_node, n_ranks=ranks,
                    sequence_parallel=sp, critic_sequence_parallel=critic_sp, rollout_engine=engine,
                    cpu_ranks_per_node=trainer.cpu_ranks_per_node if device == "cpu" else None)
