"""verl's `verl.tools.tool_registry`: the tool YAML and function-tool loading of verl/workers/tools/openai_tools.py."""

from verl.workers.tools.openai_tools import load_all_tools, load_function_tools, load_tool_yaml

__all__ = ["load_all_tools", "load_function_tools", "load_tool_yaml"]
