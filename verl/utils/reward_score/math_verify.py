r"""Math-Verify's equivalence as a reward (verl's `verl.utils.reward_score.math_verify`, which verl's router does not
use by default; a custom reward function or the comment in verl's router points MATH sets at it).

    gold  = math_verify.parse("\boxed{" + ground_truth + "}", LaTeX extraction)
    preds = math_verify.parse(response, expression and LaTeX extraction)
    score = 1.0 if some pred verifies equal to some gold, else 0.0 (also when either parse finds nothing)

Within `timeout` seconds for the whole check (main thread only, SIGALRM), else `timeout_score`; any other failure
scores 0. verl runs the check in a spawned worker process for its time limit; here it runs in the calling process,
with math_verify's own per-step limits off (they use the same alarm).
"""

from __future__ import annotations

from typing import Any

from verl.utils.time_limit import TimeLimitExceeded, time_limit


def compute_score(model_output: str, ground_truth: Any, timeout_score: float = 0, timeout: float = 30.0) -> float:
    """The Math-Verify score of the module docstring."""
    from math_verify.grader import verify
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, parse

    try:
        with time_limit(timeout):
            gold = parse(f"\\boxed{{{ground_truth}}}", (LatexExtractionConfig(),), parsing_timeout=None)
            preds = parse(model_output, (ExprExtractionConfig(), LatexExtractionConfig()), parsing_timeout=None)
            if not (gold and preds):
                return 0.0
            return 1.0 if any(verify(g, p, timeout_seconds=None) for p in preds for g in gold) else 0.0
    except TimeLimitExceeded:
        return timeout_score
    except Exception:  # math_verify's own failures: not equal
        return 0.0
