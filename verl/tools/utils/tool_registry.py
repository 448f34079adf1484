"""verl's `verl.tools.utils.tool_registry` (verl 0.9: `verl.tools.tool_registry`): the tools of a tool YAML, built by
verl/workers/tools/openai_tools.py."""

from __future__ import annotations

from enum import Enum

from verl.workers.tools.openai_tools import import_class, load_all_tools, load_tool_yaml

__all__ = ["ToolType", "get_tool_class", "initialize_tools_from_config", "load_all_tools"]


class ToolType(Enum):
    """A tool entry's `config.type`: native only (MCP tools are not built in Quiver)."""

    NATIVE = "native"


def get_tool_class(cls_name: str) -> type:
    """The tool class at the dotted path `cls_name`, resolved as a tool YAML's class_name is."""
    return import_class("get_tool_class", cls_name)


initialize_tools_from_config = load_tool_yaml
