"""Competitive-programming sets (data_source `codecontests`, `apps`, `codeforces`, `taco`), verl's rule: the
continuous code score.

    score = prime_code.compute_score(response, tests, continuous=True)        without a SandboxFusion server
          = sandbox_fusion.compute_score(url, ..., continuous=True)          with reward_model.sandbox_fusion.url

i.e. 1.0 when the program passes every test, else the fraction of the first 10 tests it passes (prime_code.py and
sandbox_fusion.py state how each runs and compares programs). The tests are APPS-format JSON, {"inputs": [...],
"outputs": [...]} with an optional "fn_name", whose inputs and outputs are strings. `memory_mb`
(reward_model.code_execution.memory_mb) bounds the local sandbox; verl's time limits (5 s per test for the all-tests
run, 10 s for each of the first ten) are prime_code's own, not reward_model.code_execution's.
"""

from __future__ import annotations

from typing import Any

from verl.utils.reward_score import prime_code, sandbox_fusion


def compute_score(solution_str: str, ground_truth: Any, sandbox_fusion_url: str | None = None,
                  concurrent_semaphore: Any = None, memory_limit_mb: int | None = None, memory_mb: int = 1024) -> float:
    """The continuous score of the module docstring."""
    if sandbox_fusion_url:
        score, _ = sandbox_fusion.compute_score(sandbox_fusion_url, concurrent_semaphore, memory_limit_mb,
                                                solution_str, ground_truth, continuous=True)
    else:
        score, _ = prime_code.compute_score(solution_str, ground_truth, continuous=True, memory_mb=memory_mb)
    return float(score)
