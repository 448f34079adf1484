"""verl's `verl.tools.gsm8k_tool.Gsm8kTool`: verl/workers/tools/gsm8k_tool.py."""

from verl.workers.tools.gsm8k_tool import Gsm8kTool

__all__ = ["Gsm8kTool"]
