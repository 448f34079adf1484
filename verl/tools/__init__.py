"""verl's tool package paths (`verl.tools.*`); the code is in verl/workers/tools/openai_tools.py and its neighbours."""

from verl.workers.tools.openai_schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.workers.tools.openai_tools import OpenAITool as BaseTool
from verl.workers.tools.openai_tools import function_tool, load_all_tools

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse", "function_tool", "load_all_tools"]
