"""A generative reward model as a training reward: a served LLM judges each response against the reference answer.

verl 0.9 runs a generative reward model by serving it from its reward loop (`reward_model.use_reward_loop`,
`reward_model.rollout.*`). Quiver grades with a model served at an OpenAI-compatible endpoint instead, through the
LLM judge of `llm_judge.py` (the one ARPO's evaluation uses): serve the model, then point the custom reward
function here::

    vllm serve $GENRM --served-model-name genrm --port 8001 &
    python3 -m verl.trainer.main_ppo ... \\
        custom_reward_function.path=verl/utils/reward_score/judge_reward.py \\
        +custom_reward_function.reward_kwargs.base_url=http://127.0.0.1:8001/v1 \\
        +custom_reward_function.reward_kwargs.model=genrm

Or let the run serve the judge (verl 0.9's reward loop): `reward_model.enable=true reward_model.model.path=$GENRM
reward_model.rollout.name=vllm` starts vLLM's server for the run, and this function gets its address as
`reward_router_address` (no base_url then).

The score is 1.0 when the judge (or, without a call, the rule check) finds the response's final answer equal to the
reference (`reward_model.ground_truth`), else 0.0; the row's question is `extra_info.question`, else the prompt's
last user message the reward manager passes. Replies are cached in `reward_kwargs.cache_path` (a JSON file) when it
is set, so a rerun asks only what it never asked; an endpoint that stays down raises `EndpointError`, which the
reward manager reports as a failed grading. One judge client is kept per (base_url, model) in each process.
"""

from __future__ import annotations

import functools
from typing import Any

from verl.utils.json_cache import JsonCache
from verl.utils.openai_endpoint import Endpoint, EndpointConfig
from verl.utils.reward_score.llm_judge import JudgeItem, LLMJudge


@functools.cache
def _judge(base_url: str, model: str | None, cache_path: str | None, max_tokens: int, concurrency: int) -> LLMJudge:
    endpoint = Endpoint(EndpointConfig(base_url=base_url, model=model, concurrency=concurrency))
    return LLMJudge(endpoint, cache=JsonCache(cache_path) if cache_path else None, max_tokens=max_tokens)


def _question(extra_info: dict | None) -> str:
    info = extra_info or {}
    if info.get("question"):
        return str(info["question"])
    prompt = info.get("prompt") or info.get("raw_prompt") or []
    users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users else ""


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, *,
                  base_url: str | None = None, model: str | None = None, cache_path: str | None = None,
                  max_tokens: int = 128, concurrency: int = 8, reward_router_address: str | None = None,
                  **_: Any) -> dict[str, Any]:
    """{"score", "judge_status", "judge_answer"} of one response (module docstring). The judge is at `base_url`, or
    with the run's served reward model at http://<reward_router_address>/v1."""
    if base_url is None and reward_router_address is None:
        raise ValueError("judge_reward needs the judge's endpoint: custom_reward_function.reward_kwargs.base_url, or a "
                         "served reward model (reward_model.rollout.name), whose address the trainer passes")
    base_url = base_url or f"http://{reward_router_address}/v1"
    references = tuple(str(r) for r in ground_truth) if isinstance(ground_truth, (list, tuple)) else (str(ground_truth),)
    task = "math" if "math" in str(data_source).lower() or str(data_source).startswith("gsm8k") else "qa"
    verdict = _judge(base_url, model, cache_path, max_tokens, concurrency).grade(
        [JudgeItem(_question(extra_info), references, solution_str, task)])[0]
    return {"score": 1.0 if verdict.correct else 0.0, "judge_status": verdict.status, "judge_answer": verdict.answer}
