"""Calling a user's function or class with the keyword arguments it takes: plug-ins (reward functions, reward
managers, advantage estimators) are written against verl's signatures, and Quiver may have more to give them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def takes_keyword(function: Callable, name: str) -> bool:
    """Whether `function` (or a class's constructor) takes `name` as a keyword argument, or takes **kwargs."""
    parameters = inspect.signature(function).parameters
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def accepted_keywords(function: Callable, candidates: dict[str, Any]) -> dict[str, Any]:
    """The entries of `candidates` that `function` (or a class's constructor) takes as keyword arguments: all of them
    when it takes **kwargs."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(candidates)
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {name: value for name, value in candidates.items() if name in names}
