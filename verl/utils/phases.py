"""The phases of a PPO step, named once: the trainer's timer key (its `timing_s/<key>` metric), the memory name (the
estimate's phase and the device door's `memory/max_allocated_gib/<name>` metric) and the label an out-of-memory
message gives it. The step table in docs/architecture.md lists them in this order."""

from __future__ import annotations

from enum import Enum


class Phase(Enum):
    """One phase of `RayPPOTrainer._step`. `timer`: its timer key (None: not timed on its own); `memory`: its name in
    the memory estimate and the door's peak metrics (None: not estimated); `label`: its name for a person."""

    #                 timer key         memory name        label
    GENERATE = ("gen", "generate", "generate")
    GENERATE_GREEDY = ("gen_max", None, "generate (greedy baseline)")  # ReMax's baseline
    REWARD = ("reward", "reward", "reward")
    OLD_LOG_PROB = ("old_log_prob", "old_log_prob", "old_log_prob")
    REF = ("ref", "ref", "ref")
    TEACHER = ("teacher", None, "teacher log-probs")  # on-policy distillation
    VALUES = ("values", "values", "values")
    ADV = ("adv", None, "adv")
    UPDATE_CRITIC = ("update_critic", "update_critic", "update_critic")
    UPDATE_ACTOR = ("update_actor", "update_actor", "update_actor")
    OPTIMIZER_STEP = (None, "optimizer_step", "optimizer_step")  # timed within update_actor
    VALIDATION = ("testing", None, "validation")
    STEP = ("step", None, "step")

    def __init__(self, timer: str | None, memory: str | None, label: str):
        self.timer = timer
        self.memory = memory
        self.label = label

    @classmethod
    def of_timer(cls, key: str) -> Phase | None:
        """The phase timed as `key`, else None."""
        return next((phase for phase in cls if phase.timer == key), None)
