"""Name -> plug-in registries: the config names a plug-in, a decorator puts it in a dict, a lookup gets it back."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any


def _key(name: str | Enum) -> str:
    return name.value if isinstance(name, Enum) else name


def register_in(registry: dict[str, Any], kind: str, name: str | Enum) -> Callable[[Any], Any]:
    """Decorator adding a function or class to `registry` as `name`; a different object under a taken name fails."""
    name = _key(name)

    def decorator(obj: Any) -> Any:
        if registry.get(name, obj) is not obj:
            raise ValueError(f"{kind} '{name}' is already registered by {registry[name]!r}")
        registry[name] = obj
        return obj

    return decorator


def lookup(registry: dict[str, Any], config_key: str, name: str | Enum, known: Iterable[str] = ()) -> Any:
    """`registry[name]`, or a ValueError that names the config key to fix and lists the registered names and `known`
    (names that register on first use, as the rollout engines' modules do when imported)."""
    name = _key(name)
    if name not in registry:
        raise ValueError(f"{config_key}={name!r} is not registered; known: {sorted({*registry, *known})}")
    return registry[name]
