r"""The deep-research reward of ARPO / AEPO (their released reward function): a format gate, then answer F1.

    score = -1                      if the format is broken or there is no \boxed answer in <answer>
          = F1 + 0.1                if F1 > 0 and the response used both the search and the python tool
          = F1                      otherwise (0 when the answer shares no token with any ground truth)

The format gate: as many `<think>` as `</think>` tags (at least one); exactly one `<answer>` and one `</answer>`;
every `<search>` / `<python>` followed, in order, by its closing tag, `<result>` and `</result>` (so a call cut off
by the length limit fails); `\boxed` inside the answer. F1 is SQuAD's token F1 after normalisation (lower case, no
punctuation, no articles, single spaces), the best over the ground truths; a yes / no / noanswer answer or ground truth
counts only when both are the same word. The response text includes the tool results, as the trainer decodes it.

Used for `data_source` deep_research, DR_grpo_mix (the seed's training set) and tool_arithmetic (Quiver's tool demo,
`verl/demo/tool_tasks.py`). tool_arithmetic keeps this reward rather than a stricter exact match so that the
demo trains on the reward the deep-research recipes use: its ground truth is one integer, so F1 is 1 exactly when the
boxed answer is that integer alone ("1,234" counts, punctuation goes) and 0 for any other number; only extra words
("1234 apples", F1 2/3) get partial credit. One caveat: the bonus looks for the closing tags, not for tools that ran,
so in a python-only run a response that writes its own `<search>..</search> <result>..</result>` also gets +0.1.

The reference's signature is compute_score(data_source, solution_str, ground_truth, extra_info); here data_source comes
last, as in every module of this package (`default_compute_score` passes solution_str and ground_truth by position),
and the reward managers pass everything by keyword, so `custom_reward_function.path` may also name this file.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from typing import Any

import numpy as np

from verl.utils.reward_score.math import last_boxed_only_string

TOOL_TAGS = ("search", "python")
MULTI_TOOL_BONUS = 0.1
_YES_NO = {"yes", "no", "noanswer"}
_PUNCTUATION = set(string.punctuation)
_TAG = re.compile(r"</?(?:search|python|result)>")


def validate_format(response: str) -> tuple[bool, str]:
    """(ok, reason) of the format gate in the module docstring."""
    opened, closed = response.count("<think>"), response.count("</think>")
    if opened == 0 or opened != closed:
        return False, f"<think> x{opened} and </think> x{closed} must match and be at least one"
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return False, "needs exactly one <answer> and one </answer>"
    expected = None  # the tag that must come next in a tool call
    for tag in _TAG.findall(response):
        if expected is None:
            if tag.strip("<>") not in TOOL_TAGS:
                return False, f"{tag} outside a tool call"
            call = tag.strip("<>")
            steps = iter([f"</{call}>", "<result>", "</result>"])
            expected = next(steps)
        elif tag != expected:
            return False, f"{tag} where {expected} belongs"
        else:
            expected = next(steps, None)
    if expected is not None:
        return False, f"a tool call ends before {expected}"
    answer = response[response.index("<answer>") : response.index("</answer>")]
    if "\\boxed" not in answer:
        return False, "no \\boxed in the answer"
    return True, "ok"


def extract_answer(response: str) -> str | None:
    """The last \\boxed{...} (also `\\boxed x` and \\fbox) inside <answer>...</answer>."""
    match = re.search(r"<answer>(.*?)</answer>", response, re.DOTALL)
    return last_boxed_only_string(match.group(1)) if match else None


def normalize_text(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1_score(prediction: str, ground_truth: str) -> float:
    """SQuAD token F1 of two strings after `normalize_text`."""
    pred, truth = normalize_text(prediction), normalize_text(ground_truth)
    if (pred in _YES_NO or truth in _YES_NO) and pred != truth:
        return 0.0
    common = Counter(pred.split()) & Counter(truth.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred.split()), same / len(truth.split())
    return 2 * precision * recall / (precision + recall)


def ground_truth_list(ground_truth: Any) -> list[str]:
    """A string, a list / tuple / array of strings, a JSON-encoded list, or a number -> list of strings."""
    if isinstance(ground_truth, np.ndarray):
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, str):
        stripped = ground_truth.strip()
        if stripped.startswith("["):
            try:
                parsed = json.loads(stripped)
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, list):
                return [str(g) for g in parsed]
        return [ground_truth]
    if isinstance(ground_truth, (list, tuple)):
        return [str(g) for g in ground_truth]
    return [str(ground_truth)]


def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  data_source: str | None = None) -> dict[str, Any]:
    """{"score", "reason", "answer", "f1_score"} of one response (module docstring). The argument order also fits
    verl's custom_reward_function calls, which pass everything by keyword."""
    ok, reason = validate_format(solution_str)
    if not ok:
        return {"score": -1.0, "reason": f"format: {reason}", "answer": None, "f1_score": 0.0}
    answer = extract_answer(solution_str)
    if answer is None:
        return {"score": -1.0, "reason": "no \\boxed answer in <answer>", "answer": None, "f1_score": 0.0}
    f1 = max((f1_score(answer, truth) for truth in ground_truth_list(ground_truth)), default=0.0)
    both_tools = all(f"</{tag}>" in solution_str for tag in TOOL_TAGS)
    score = f1 + MULTI_TOOL_BONUS if f1 > 0 and both_tools else f1
    reason = "correct" if f1 == 1.0 else "partial" if f1 > 0 else "wrong"
    return {"score": score, "reason": reason, "answer": answer, "f1_score": f1}
