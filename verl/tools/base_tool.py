"""verl's `verl.tools.base_tool.BaseTool`, the async tool with an OpenAI schema: verl/workers/tools/openai_tools.py."""

from verl.workers.tools.openai_schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.workers.tools.openai_tools import OpenAITool as BaseTool

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse"]
