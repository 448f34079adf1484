"""Reward managers register here by name; `reward_model.reward_manager=<name>` selects one."""

from __future__ import annotations

from verl.utils.registry import lookup, register_in

REWARD_MANAGER_REGISTRY: dict[str, type] = {}


def register_reward_manager(name: str):
    """Class decorator: make a reward manager selectable as `reward_model.reward_manager=name`."""
    return register_in(REWARD_MANAGER_REGISTRY, "Reward manager", name)


# verl's name of the decorator (`from verl.workers.reward_manager import register`).
register = register_reward_manager


def get_reward_manager_cls(name: str) -> type:
    """The reward manager class registered as `name`."""
    return lookup(REWARD_MANAGER_REGISTRY, "reward_model.reward_manager", name)
