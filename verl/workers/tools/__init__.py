"""Tools the agent loop calls: `<tag>content</tag>` in a response runs `tool.execute(content)` (see manager.py)."""

from verl.workers.tools.base import BaseTool, ToolError
from verl.workers.tools.manager import ToolManager, ToolResult

__all__ = ["BaseTool", "ToolError", "ToolManager", "ToolResult"]
