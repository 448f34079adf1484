"""verl's GSM8K tool (`verl.tools.gsm8k_tool.Gsm8kTool`, function `calc_gsm8k_reward` in verl's multi-turn
examples): the model submits an answer and reads back how it scored, and may try again.

    create(instance_id, ground_truth="72")       # or create_kwargs={"ground_truth": "72"}
    execute(instance_id, {"answer": "72"})       # -> "Current parsed answer=72 reward=1.0", step reward 0.0
    calc_reward(instance_id)                     # -> the score of the last answer submitted

The answer (spaces and a leading "####" stripped) is scored as "#### <answer>" by verl/utils/reward_score/gsm8k.py
with the flexible method (its last number), as verl does: 1.0 for the right number, else 0.0. As in verl, a
submission whose score does not beat the previous submission's (0 before the first) gets a step reward of -0.05,
which discourages resubmitting; one that improves gets 0. The schema is in configs/tools/gsm8k_tool.yaml.
"""

from __future__ import annotations

from typing import Any

from verl.utils.reward_score import gsm8k
from verl.workers.tools.openai_schemas import ToolResponse
from verl.workers.tools.openai_tools import OpenAITool, create_kwargs

NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kTool(OpenAITool):
    """Per instance: the ground truth, the last answer submitted ("#### <answer>") and its reward."""

    async def create(self, instance_id: str | None = None, ground_truth: str | None = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        if ground_truth is None:
            ground_truth = create_kwargs(kwargs).get("ground_truth")
        if ground_truth is None:
            raise ValueError(f"tool {self.name}: create() needs ground_truth (or create_kwargs={{'ground_truth': "
                             "...}}, from the data's tools_kwargs)")
        instance_id, response = await super().create(instance_id)
        self._instance_dict[instance_id] = {"ground_truth": str(ground_truth), "response": "", "reward": 0.0}
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        state = self.instance(instance_id)
        answer = str((parameters or {}).get("answer", "")).strip().removeprefix("####").strip()
        state["response"] = f"#### {answer}"
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer} reward={reward}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self.instance(instance_id)
        return gsm8k.compute_score(state["response"], state["ground_truth"], method="flexible")
