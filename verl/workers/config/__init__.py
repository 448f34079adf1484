"""Typed config sections of the workers (verl's `verl.workers.config`): actor, model, reference, critic, rollout."""

from verl.workers.config.actor import (
    ActorConfig,
    CheckpointConfig,
    CriticConfig,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
    PolicyLossConfig,
    RefConfig,
)
from verl.workers.config.rollout import BranchingConfig, PPORolloutConfig, RolloutConfig, ToolsConfig

__all__ = ["ActorConfig", "BranchingConfig", "CheckpointConfig", "CriticConfig", "FSDPConfig", "ModelConfig",
           "OptimConfig", "PolicyLossConfig", "PPORolloutConfig", "RefConfig", "RolloutConfig", "ToolsConfig"]
