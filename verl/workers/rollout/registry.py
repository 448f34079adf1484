"""Rollout engines by name: `actor_rollout_ref.rollout.name=<name>` picks the class registered as `<name>`.

An engine registers itself with `@register_rollout("<name>")` (a plug-in module listed in `trainer.plugins` does the
same). The engines shipped with Quiver register when their module is imported, which `get_rollout_cls` does on first
use, so that an engine's heavy dependency (vllm, sglang) is needed only when it is chosen.
"""

from __future__ import annotations

import importlib

from verl.utils.registry import lookup, register_in

ROLLOUT_REGISTRY: dict[str, type] = {}

# Engines shipped with Quiver: name -> the module that registers it.
BUILTIN_ROLLOUT_MODULES = {
    "hf": "verl.workers.rollout.hf_rollout",
    "vllm": "verl.workers.rollout.vllm_rollout",
    "sglang": "verl.workers.rollout.sglang_rollout",
    "trtllm": "verl.workers.rollout.trtllm_rollout",
    "openai": "verl.workers.rollout.openai_rollout",
}

# Engine names verl accepts whose engines Quiver does not have: unless a plug-in registered one under that name, they
# run on what rollout.name=auto picks (announced at start-up by config_rules.announce_inert_keys). None today.
ENGINES_NOT_BUILT: dict[str, str] = {}


def register_rollout(name: str):
    """Class decorator: make a `RolloutEngine` selectable with `actor_rollout_ref.rollout.name=<name>`."""
    return register_in(ROLLOUT_REGISTRY, "Rollout engine", name)


def get_rollout_cls(name: str) -> type:
    """The engine class registered as `name` (importing the built-in module that defines it if needed)."""
    if name not in ROLLOUT_REGISTRY and name in BUILTIN_ROLLOUT_MODULES:
        importlib.import_module(BUILTIN_ROLLOUT_MODULES[name])
    return lookup(ROLLOUT_REGISTRY, "actor_rollout_ref.rollout.name", name, known=BUILTIN_ROLLOUT_MODULES)


def is_registered(name: str) -> bool:
    """Whether a class is registered as `name` now (without importing a built-in engine's module)."""
    return name in ROLLOUT_REGISTRY


def known_rollout_names() -> list[str]:
    """Every selectable `rollout.name`: "auto", the built-in engines and whatever `register_rollout` added."""
    return sorted({"auto", *BUILTIN_ROLLOUT_MODULES, *ENGINES_NOT_BUILT, *ROLLOUT_REGISTRY})
