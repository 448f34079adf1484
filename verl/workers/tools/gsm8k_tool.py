"""verl's GSM8K tool (`verl.tools.gsm8k_tool.Gsm8kTool`, function `calc_gsm8k_reward` in verl's multi-turn
examples): the model submits an answer and reads back how it scored, and may try again. It behaves as verl's does:

    create(instance_id, ground_truth="72")       # or create_kwargs={"ground_truth": "72"}
    execute(instance_id, {"answer": "72"})       # -> "Current parsed answer='72' reward=1.0", step reward 0.0
    calc_reward(instance_id)                     # -> the score of the last answer submitted

The answer (made a string) is scored as "#### <answer>" (as it is when it already starts with "#### ") by
verl/utils/reward_score/gsm8k.py with the flexible method (its last number, compared as a string with the ground
truth): 1.0 for the right number, else 0.0. A submission whose score does not beat the previous submission's (0
before the first) gets a step reward of -0.05, which discourages resubmitting; one that improves gets 0. Without a
ground truth every answer scores 0, as in verl (a warning says so once). The schema is in configs/tools/gsm8k_tool.yaml.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.utils.reward_score import gsm8k
from verl.workers.tools.openai_schemas import ToolResponse
from verl.workers.tools.openai_tools import OpenAITool, create_kwargs

logger = logging.getLogger(__name__)

NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kTool(OpenAITool):
    """Per instance: the ground truth, the last answer submitted ("#### <answer>") and its reward."""

    _warned_no_ground_truth = False

    async def create(self, instance_id: str | None = None, ground_truth: str | None = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        if ground_truth is None:
            ground_truth = create_kwargs(kwargs).get("ground_truth")
        if ground_truth is None and not Gsm8kTool._warned_no_ground_truth:
            Gsm8kTool._warned_no_ground_truth = True
            logger.warning("tool %s: create() got no ground_truth (the data's extra_info.tools_kwargs.%s."
                           "create_kwargs.ground_truth), so every answer scores 0", self.name, self.name)
        instance_id, response = await super().create(instance_id)
        self._instance_dict[instance_id] = {"ground_truth": ground_truth, "response": "", "reward": 0.0}
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        state = self.instance(instance_id)
        answer = (parameters or {}).get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        state["response"] = answer if answer.startswith("#### ") else f"#### {answer}"
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward!r}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self.instance(instance_id)
        return gsm8k.compute_score(state["response"], state["ground_truth"], method="flexible", format_score=0.0,
                                   score=1.0)
