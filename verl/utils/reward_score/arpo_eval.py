r"""Rule grading of ARPO's evaluation sets (data_source `arpo_eval/<set>`, written by data/preprocess/arpo_eval.py).

ARPO's evaluation (its `evaluation/src/metrics.py`) grades the final answer of a response by rules, and reports per
data set:

- `em`: the answer equals a reference after SQuAD normalisation (lower case, no punctuation or articles);
- `acc`: a normalised reference occurs inside the normalised answer;
- `f1`: SQuAD token F1, the best over the references (`deep_research.f1_score`, the training reward's F1);
- `math_equal`: the answer is mathematically equivalent to a reference (`math.is_equiv`: math_verify, then the
  normalised string, then sympy).

The score is `math_equal` for math sets and `f1` for QA sets (`extra_info["task"]`, "math" or "qa"), as ARPO's main
score without a judge; an LLM judge (verl/utils/reward_score/llm_judge.py, `main_eval judge.enable=true`) then
replaces it. Unlike the training reward there is no format gate: the answer is the last `\boxed{}` inside
`<answer>...</answer>`, else the last `\boxed{}` after the reasoning, and a response without one scores 0 with
status `no_answer`.
"""

from __future__ import annotations

from typing import Any

from verl.utils.reward_score import deep_research, math

TASKS = ("math", "qa")


def extract_final_answer(response: str) -> str | None:
    r"""The last \boxed{} inside <answer>...</answer>, else the last \boxed{} (after "</think>" when there is one)."""
    answer = deep_research.extract_answer(response)
    return answer if answer is not None else math.extract_answer(response)


def task_of(extra_info: dict | None, ability: str | None = None) -> str:
    """"math" or "qa": `extra_info["task"]`, else the row's ability ("math" -> math), else qa."""
    task = (extra_info or {}).get("task") or ("math" if ability == "math" else "qa")
    if task not in TASKS:
        raise ValueError(f"extra_info.task={task!r} must be one of {TASKS}")
    return task


def rule_equal(answer: str, references: list[str], task: str) -> bool:
    """Whether the answer is a reference by rule: math equivalence for math, normalised exact match for QA."""
    if task == "math":
        return any(math.is_equiv(answer, reference) for reference in references)
    return any(deep_research.normalize_text(answer) == deep_research.normalize_text(r) for r in references)


def rule_metrics(answer: str, references: list[str], task: str) -> dict[str, float]:
    """em, acc, f1 (and math_equal for math) of one extracted answer against the references (module docstring)."""
    normalized = deep_research.normalize_text(answer)
    refs = [deep_research.normalize_text(r) for r in references]
    metrics = {
        "em": float(any(normalized == ref for ref in refs)),
        "acc": float(any(ref and ref in normalized for ref in refs)),
        "f1": max((deep_research.f1_score(answer, r) for r in references), default=0.0),
    }
    if task == "math":
        metrics["math_equal"] = float(rule_equal(answer, references, task))
    return metrics


def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, Any]:
    """{"score", "answer", "em", "acc", "f1", ("math_equal",) "reward_status"} of one response (module docstring)."""
    task = task_of(extra_info)
    answer = extract_final_answer(solution_str)
    if answer is None:
        zeros = dict.fromkeys(("em", "acc", "f1", "math_equal") if task == "math" else ("em", "acc", "f1"), 0.0)
        return {"score": 0.0, "answer": "", **zeros, "reward_status": "no_answer"}
    metrics = rule_metrics(answer, deep_research.ground_truth_list(ground_truth), task)
    score = metrics["math_equal"] if task == "math" else metrics["f1"]
    return {"score": score, "answer": answer, **metrics, "reward_status": "answered"}
