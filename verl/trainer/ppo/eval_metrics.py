"""Offline evaluation metrics over n sampled responses per prompt: avg@n (mean score) and pass@k.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1):
with n samples of a prompt of which c are correct, the chance that k samples drawn without replacement contain at
least one correct one is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

The product form never builds a binomial coefficient, so it stays exact in floating point for any n. A sample counts
as correct when its score is >= `correct_threshold` (default 1.0: the full reward of the rule scorers in
`verl/utils/reward_score`, while partial credit such as arithmetic's 0.1 for a well-formed wrong answer is not
correct). The per-data-source value is the mean of pass@k over that source's prompts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np

ALL_SOURCES = "all"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with `n` samples of which `c` are correct (needs 0 <= c <= n, 1 <= k <= n)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c={c} correct samples must be between 0 and n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} must be between 1 and the number of samples n={n}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def default_ks(n: int) -> list[int]:
    """k = 1, 2, 4, ... up to n, plus n itself when n is not a power of two (pass@n is the usual headline)."""
    if n < 1:
        raise ValueError(f"n={n} samples per prompt must be at least 1")
    ks = [1 << i for i in range(n.bit_length())]
    return ks if ks[-1] == n else [*ks, n]


def _source_metrics(groups: list[list[float]], n_samples: int, ks: Sequence[int], threshold: float) -> dict:
    scores = [s for group in groups for s in group]
    avg = float(np.mean(scores))
    metrics = {"num_prompts": len(groups), f"avg@{n_samples}": avg, f"mean@{n_samples}": avg}
    n_correct = [sum(s >= threshold for s in group) for group in groups]
    for k in ks:
        metrics[f"pass@{k}"] = float(np.mean([pass_at_k(n_samples, c, k) for c in n_correct]))
    return metrics


def compute_eval_metrics(
    data_sources: Sequence[str],
    uids_or_prompt_ids: Sequence[Hashable],
    scores: Sequence[float],
    n_samples: int,
    ks: Sequence[int] | None = None,
    correct_threshold: float = 1.0,
) -> dict[str, dict[str, float]]:
    """Per-data-source metrics of `n_samples` scored responses per prompt, plus an "all" row over every prompt.

    The three sequences hold one entry per response (any order); responses with the same uid belong to one prompt,
    and every prompt must have exactly `n_samples` of them. `ks` defaults to `default_ks(n_samples)`.

    Returns `{data_source: {"num_prompts", "avg@N", "mean@N", "pass@k" for k in ks}, ..., "all": {...}}` with
    N = n_samples; "mean@N" is the same number as "avg@N" under the name RLPR and verl's validation use.
    """
    if not len(data_sources) == len(uids_or_prompt_ids) == len(scores):
        raise ValueError(f"compute_eval_metrics: got {len(data_sources)} data sources, {len(uids_or_prompt_ids)} "
                         f"uids and {len(scores)} scores; they must have one entry per response")
    if len(scores) == 0:
        raise ValueError("compute_eval_metrics: no responses to evaluate")
    ks = list(ks) if ks is not None else default_ks(n_samples)
    bad_ks = [k for k in ks if not 1 <= k <= n_samples]
    if bad_ks:
        raise ValueError(f"compute_eval_metrics: ks={bad_ks} must be between 1 and n_samples={n_samples}")

    groups: dict[Hashable, list[float]] = defaultdict(list)
    source_of: dict[Hashable, str] = {}
    for source, uid, score in zip(data_sources, uids_or_prompt_ids, scores):
        if source_of.setdefault(uid, source) != source:
            raise ValueError(f"prompt {uid!r} has responses from two data sources: {source_of[uid]!r} and {source!r}")
        groups[uid].append(float(score))
    wrong = {uid: len(group) for uid, group in groups.items() if len(group) != n_samples}
    if wrong:
        uid, count = next(iter(wrong.items()))
        raise ValueError(f"every prompt needs n_samples={n_samples} responses; prompt {uid!r} has {count} "
                         f"({len(wrong)} prompts are off)")

    by_source: dict[str, list[list[float]]] = defaultdict(list)
    for uid, group in groups.items():
        by_source[source_of[uid]].append(group)
    metrics = {source: _source_metrics(by_source[source], n_samples, ks, correct_threshold)
               for source in sorted(by_source)}
    metrics[ALL_SOURCES] = _source_metrics(list(groups.values()), n_samples, ks, correct_threshold)
    return metrics


def merge_metrics(main: dict[str, dict[str, float]], other: dict[str, dict[str, float]],
                  prefix: str) -> dict[str, dict[str, float]]:
    """`main`'s metrics per data source, followed by `other`'s under `<prefix>/<name>` (num_prompts once): e.g. the
    judge's pass@k as the main score with the rule scores alongside as rule/pass@k."""
    return {source: {**values, **{f"{prefix}/{name}": v for name, v in other[source].items() if name != "num_prompts"}}
            for source, values in main.items()}


def format_metrics_table(metrics: dict[str, dict[str, float]], markdown: bool = False) -> str:
    """A table: one row per data source, one column per metric (4 decimals); plain text, or Markdown."""
    columns = list(next(iter(metrics.values())))
    header = ["data_source", *columns]
    rows = [[source] + [f"{v:.4f}" if isinstance(v, float) else str(v) for v in values.values()]
            for source, values in metrics.items()]
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in [header, *rows]]
        lines.insert(1, "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(header))) + "|")
        return "\n".join(lines)
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
