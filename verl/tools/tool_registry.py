"""verl's `verl.tools.tool_registry`: the tool YAML and function-tool loading of verl/workers/tools/openai_tools.py
(and of verl.tools.utils.tool_registry, its older path)."""

from verl.tools.utils.tool_registry import ToolType, get_tool_class, initialize_tools_from_config
from verl.workers.tools.openai_tools import load_all_tools, load_function_tools, load_tool_yaml

__all__ = ["ToolType", "get_tool_class", "initialize_tools_from_config", "load_all_tools", "load_function_tools",
           "load_tool_yaml"]
