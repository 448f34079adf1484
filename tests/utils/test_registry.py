"""The shared name -> plug-in registry helpers in verl/utils/registry.py."""

from __future__ import annotations

from enum import Enum

import pytest

from verl.utils.registry import lookup, register_in


class Color(str, Enum):
    RED = "red"


def test_register_and_lookup_by_string_or_enum():
    registry = {}

    @register_in(registry, "Thing", Color.RED)
    def red():
        return "r"

    assert list(registry) == ["red"] and type(next(iter(registry))) is str
    assert lookup(registry, "my.key", "red") is red
    assert lookup(registry, "my.key", Color.RED) is red
    assert register_in(registry, "Thing", "red")(red) is red  # the same object again is fine


def test_conflicts_and_unknown_names_explain_themselves():
    registry = {"a": len}
    with pytest.raises(ValueError, match="Thing 'a' is already registered"):
        register_in(registry, "Thing", "a")(print)
    with pytest.raises(ValueError, match=r"my\.key='b' is not registered; known: \['a'\]"):
        lookup(registry, "my.key", "b")
