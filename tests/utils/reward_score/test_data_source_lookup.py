"""data_source -> scorer lookup (verl/utils/reward_score/__init__.py): exact names, then prefix families, then an
error naming both; and the boxed-answer sources (prime_math: math.py; numina_*: verl's prime_math.py)."""

from __future__ import annotations

import importlib

import pytest

from verl.utils.reward_score import (
    DATA_SOURCE_PREFIX_TO_MODULE,
    DATA_SOURCE_TO_MODULE,
    default_compute_score,
    scorer_module,
)


@pytest.mark.parametrize(
    ("data_source", "module"),
    [
        ("math_dapo", "math_dapo"),
        ("math", "math_dapo"),  # an exact name
        ("aime2024", "math_dapo"),  # the "aime" prefix, as in verl
        ("aime24", "math_dapo"),
        ("aime", "math_dapo"),
        ("numina_cn_k12", "prime_math"),
        ("numina_amc_aime", "prime_math"),  # a numina_ split, not an AIME set
        ("prime_math", "math"),
        ("searchR1_musique", "search_r1_like_qa_em"),
        ("codeforces", "competition_code"),
        ("livecodebench", "code"),
    ],
)
def test_exact_names_then_prefixes(data_source, module):
    assert scorer_module(data_source) == module


@pytest.mark.parametrize("data_source", ["my/set", "my_aime", "numina", "searchr1_nq", "Apps", ""])
def test_unknown_source_lists_names_and_prefixes(data_source):
    # Prefixes match at the start only and case-sensitively, as verl's names are spelled.
    pattern = rf"data_source='{data_source}'.*'math_dapo'.*'numina_'.*'searchR1_'.*custom_reward_function\.path"
    with pytest.raises(NotImplementedError, match=pattern):
        default_compute_score(data_source, "Answer: 2", "2")


def test_every_mapped_module_has_a_compute_score():
    for module in {*DATA_SOURCE_TO_MODULE.values(), *DATA_SOURCE_PREFIX_TO_MODULE.values()}:
        assert callable(importlib.import_module(f"verl.utils.reward_score.{module}").compute_score), module


@pytest.mark.parametrize("source", ["prime_math", "numina_olympiads", "numina_synthetic_math", "numina_aops_forum"])
def test_boxed_answer_sources(source):
    assert default_compute_score(source, "So $x = \\boxed{\\frac{1}{2}}$.", "0.5") == 1.0  # math_verify: equal values
    assert default_compute_score(source, "<think>\\boxed{0.5}</think> \\boxed{2}", "0.5") == 0.0
    assert default_compute_score(source, "So x is 0.5.", "0.5") == 0.0  # nothing boxed
