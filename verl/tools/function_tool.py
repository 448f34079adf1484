"""verl's `verl.tools.function_tool`: `@function_tool` makes a function a tool (verl/workers/tools/openai_tools.py)."""

from verl.workers.tools.openai_tools import FUNCTION_TOOL_REGISTRY, FunctionTool, function_tool, load_function_tools

load_function_tools_from_path = load_function_tools  # verl's name

__all__ = ["FUNCTION_TOOL_REGISTRY", "FunctionTool", "function_tool", "load_function_tools_from_path"]
