"""verl's `verl.tools.registry`: `@register_tool("gsm8k")` files a tool class under a name.

As in verl, the tool YAML still names a tool by its class path (`class_name: my_pkg.my_tool.MyTool`, loaded by
verl/workers/tools/openai_tools.py); registering lets code look a class up by name (`ToolRegistry.get("gsm8k")`).
A second class under a name already taken is an error naming both (verl overwrites it with a warning).
"""

from __future__ import annotations

from verl.utils.registry import lookup, register_in

TOOL_REGISTRY: dict[str, type] = {}


class ToolRegistry:
    """verl's class-method view of TOOL_REGISTRY."""

    @staticmethod
    def register(tool_name: str):
        """Class decorator: file a BaseTool subclass as `tool_name`."""
        return register_in(TOOL_REGISTRY, "Tool", tool_name)

    @staticmethod
    def get(tool_name: str) -> type:
        """The class registered as `tool_name`; a ValueError listing the registered names when there is none."""
        return lookup(TOOL_REGISTRY, "register_tool name", tool_name)

    @staticmethod
    def list_tools() -> list[str]:
        return list(TOOL_REGISTRY)

    @staticmethod
    def contains(tool_name: str) -> bool:
        return tool_name in TOOL_REGISTRY

    @staticmethod
    def clear() -> None:
        """Forget every registered class (for tests)."""
        TOOL_REGISTRY.clear()


register_tool = ToolRegistry.register
