r"""RLPR's probability reward, from token log-probs to the final reward (arXiv 2506.18254).

    scoreB = agg(l_i for i in M)          l_i = log p(y*_i | x, z, y*_<i) at the rollout temperature, M = the y* tokens
    d      = f(scoreB - scoreA)            f: a shaping function by name; scoreA = 0 without debiasing
    R      = (1 - alpha) * d + alpha * F   F: the format reward in {0, 1}; alpha = format_coefficient
                                           (alpha = -1: R = d if F = 1 else -1)

plus an optional discretisation of d (`bin_K`) and the repetition penalty (-1 on a nonzero R when a 10-word window
repeats too often). Names follow the official RLPR implementation, which parses parameters out of the names:
`threshold_0`, `sigmoid_6`, `comp_threshold_0.3_sigmoid_6`, ...
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable

import torch

AGGREGATIONS = ("mean_exp_log_softmax", "mean_log_softmax", "exp_sum_log_softmax", "exp_mean_log_softmax")
FORMAT_MODES = ("R1", "R1_nothink")


def aggregate(log_probs: torch.Tensor, mask: torch.Tensor, name: str) -> torch.Tensor:
    """scoreB per row: `(bs, len)` log-probs and 0/1 mask of the y* tokens -> `(bs,)`; 0 for a row without y* tokens.

    mean_exp_log_softmax: mean token probability (the paper's); mean_log_softmax: mean log-prob;
    exp_sum_log_softmax: sequence likelihood; exp_mean_log_softmax: geometric mean of the token probabilities.
    """
    log_probs, mask = log_probs.float(), mask.float()
    count = mask.sum(-1)
    safe = count.clamp(min=1)
    if name == "mean_exp_log_softmax":
        score = (log_probs.exp() * mask).sum(-1) / safe
    elif name == "mean_log_softmax":
        score = (log_probs * mask).sum(-1) / safe
    elif name == "exp_sum_log_softmax":
        score = (log_probs * mask).sum(-1).exp()
    elif name == "exp_mean_log_softmax":
        score = ((log_probs * mask).sum(-1) / safe).exp()
    else:
        raise ValueError(f"reward_model.compute_score_name={name!r} must be one of {AGGREGATIONS}")
    return torch.where(count > 0, score, torch.zeros_like(score))


def _sigmoid(u: float) -> float:
    return 1.0 / (1.0 + math.exp(-u)) if u > -700 else 0.0


def shaping_function(name: str, rng: random.Random | None = None) -> Callable[[float], float]:
    """The shaping f of `reward_model.reward_manager_shaping_function_name` (the official implementation's names)."""
    fields = name.split("_")
    try:
        if name == "identity":
            return lambda x: x
        if name == "one_minus":
            return lambda x: 1.0 - x
        if name == "random":
            draw = rng or random.Random(0)
            return lambda x: draw.random()
        if fields[0] == "threshold" and len(fields) == 2:
            t = float(fields[1])
            return lambda x: 0.0 if x < t else x
        if fields[0] == "leaky" and len(fields) == 2:
            t = float(fields[1])
            return lambda x: 0.01 * x if x < t else x
        if fields[0] == "sigmoid" and len(fields) == 2:
            k = float(fields[1])
            return (lambda x: _sigmoid(x)) if k == 0 else (lambda x: _sigmoid(k * (2 * x - 1)))
        if fields[:2] == ["comp", "threshold"] and len(fields) == 5:
            t, kind, k = float(fields[2]), fields[3], float(fields[4])
            return _composite(t, kind, k)
    except ValueError:
        pass
    raise ValueError(f"reward_model.reward_manager_shaping_function_name={name!r} is not a known shaping function; "
                     "use identity, one_minus, random, threshold_T, leaky_T, sigmoid_K or comp_threshold_T_<sigmoid|"
                     "sigmoidv2|sigmoidv2fixed|sigmoidv3|tanh>_K")


def _composite(t: float, kind: str, k: float) -> Callable[[float], float]:
    if kind == "sigmoid":
        def f(x):
            s = _sigmoid(k * (2 * x - 1))
            return 0.0 if s < t else s
    elif kind == "sigmoidv2":
        def f(x):
            return 0.0 if x < t else _sigmoid(k * (x - t))
    elif kind == "sigmoidv2fixed":  # continuous at x = t (value t), tends to 1
        def f(x):
            return 0.0 if x < t else 2 * (1 - t) * _sigmoid(k * (x - t)) - (1 - 2 * t)
    elif kind == "sigmoidv3":
        def f(x):
            return 0.0 if x < t else _sigmoid(k * (x - 1)) + 0.5
    elif kind == "tanh":
        def f(x):
            v = (math.tanh(k * x - k / 2) + 1) / 2
            return 0.0 if v < t else v
    else:
        raise ValueError(kind)
    return f


def discretize(name: str) -> Callable[[float], float]:
    """`reward_manager_discrete_function_name`: identity, or bin_K (round to the nearest multiple of 1/K)."""
    if name == "identity":
        return lambda x: x
    match = re.fullmatch(r"bin_(\d+)", name)
    if match and int(match.group(1)) > 0:
        k = int(match.group(1))
        return lambda x: round(x * k) / k
    raise ValueError(f"reward_model.reward_manager_discrete_function_name={name!r} must be identity or bin_K (K > 0)")


_R1 = re.compile(r"<think>.*</think>.*<answer>.*</answer>.*", re.DOTALL)
_NOTHINK = re.compile(r".*<answer>.*</answer>.*", re.DOTALL)


def format_reward(response: str, mode: str = "R1") -> float:
    """F: R1 needs each of <think>, </think>, <answer>, </answer> exactly once, in that order, starting with <think>;
    R1_nothink needs exactly one <answer> and one </answer> in order."""
    if mode == "R1":
        tags = ("<think>", "</think>", "<answer>", "</answer>")
        return float(all(response.count(tag) == 1 for tag in tags) and _R1.fullmatch(response) is not None)
    if mode == "R1_nothink":
        once = response.count("<answer>") == 1 and response.count("</answer>") == 1
        return float(once and _NOTHINK.fullmatch(response) is not None)
    raise ValueError(f"reward_model.format_mode={mode!r} must be one of {FORMAT_MODES}")


def final_reward(d: float, format_score: float, format_coefficient: float = 0.1) -> float:
    """R = (1 - alpha) d + alpha F; alpha = -1 means R = d if F = 1 else -1."""
    if format_coefficient == -1:
        return d if format_score == 1 else -1.0
    if not 0 <= format_coefficient <= 1:
        raise ValueError(f"reward_model.format_coefficient={format_coefficient} must be in [0, 1] or -1")
    return (1 - format_coefficient) * d + format_coefficient * format_score


def has_repetition(response: str, max_repetitions: int = 10, window: int = 10) -> bool:
    """Whether some `window`-word run repeats at least `max_repetitions` times (words: split on whitespace, then
    on "_")."""
    words = [piece for word in response.split() for piece in word.split("_") if piece]
    if len(words) < window:
        return False
    counts = Counter(tuple(words[i : i + window]) for i in range(len(words) - window + 1))
    return max(counts.values()) >= max_repetitions


def repetition_penalty(reward: float, response: str, max_repetitions: int = 10) -> float:
    """-1 added to a nonzero reward of a repetitive response (an exact 0 stays 0, as in the official implementation)."""
    return reward - 1.0 if reward != 0 and has_repetition(response, max_repetitions) else reward
