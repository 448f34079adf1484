"""Rule rewards in verl/utils/reward_score on hand-written right, wrong and malformed responses."""

from __future__ import annotations

import threading

import pytest

from verl.utils.reward_score import arithmetic, default_compute_score, gsm8k, gsm8k_numeric
from verl.utils.reward_score import math as math_score

# ------------------------------------------------------------------ gsm8k (verl's rule; more in test_verl_rules.py)


@pytest.mark.parametrize(
    ("text", "truth", "expected"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7", 1.0),
        ("#### 1,200", "1200", 1.0),  # commas removed
        ("#### $1,200", "1200", 0.0),  # "$" before the number: no strict answer
        ("#### 5\nwait, actually #### 7", "7", 1.0),  # the last answer counts
        ("#### 7\nno, #### 8", "7", 0.0),
        ("The answer is 7", "7", 0.0),  # no "####": strict finds nothing
        ("#### seven", "7", 0.0),
    ],
)
def test_gsm8k_strict(text, truth, expected):
    assert gsm8k.compute_score(text, truth) == expected


def test_gsm8k_flexible_takes_last_number_and_scores_format():
    assert gsm8k.compute_score("3 + 4 makes 7", "7", method="flexible") == 1.0
    assert gsm8k.compute_score("7 is wrong, it is 8", "7", method="flexible") == 0.0
    assert gsm8k.compute_score("no digits here", "7", method="flexible", format_score=0.1) == 0.0
    assert gsm8k.compute_score("#### 8", "7", format_score=0.1) == 0.1
    assert gsm8k.compute_score("#### 7.00", "7") == 0.0  # strings, not numbers
    assert gsm8k.extract_solution("x #### -3,000.5 y") == "-3000.5"


def test_gsm8k_unknown_method():
    with pytest.raises(ValueError, match="method='loose'"):
        gsm8k.compute_score("#### 7", "7", method="loose")


def test_quiver_gsm8k_compares_numbers():
    assert gsm8k_numeric.compute_score("#### $1,200", "1,200") == 1.0
    assert gsm8k_numeric.compute_score("#### 7.00", "7") == 1.0
    assert gsm8k_numeric.compute_score("#### 8", "7", format_score=0.1) == 0.1
    assert gsm8k_numeric.extract_solution("3 + 4 makes 7", method="flexible") == "7"


# ------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("text", "truth", "expected"),
    [
        ("12 + 30 = 42 #### 42", "42", 1.0),
        ("#### 42", 42, 1.0),
        ("####-5", "-5", 1.0),
        ("so #### 42.", "42", 1.0),  # a sentence-ending period is not a decimal
        ("#### 41", "42", 0.1),  # well formed but wrong
        ("#### 42 ... no #### 41", "42", 0.1),  # the last answer counts
        ("#### 41 ... no #### 42", "42", 1.0),
        ("#### 42.5", "42", 0.0),  # not an integer
        ("the answer is 42", "42", 0.0),
        ("", "42", 0.0),
    ],
)
def test_arithmetic(text, truth, expected):
    assert arithmetic.compute_score(text, truth) == expected
    assert default_compute_score("arithmetic", text, truth) == expected


# ------------------------------------------------------------------ math


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{5}", "5"),
        ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{2}}{\\sqrt{3}}}.", "\\frac{\\sqrt{2}}{\\sqrt{3}}"),
        ("\\boxed{{a}+{b}}", "{a}+{b}"),
        ("\\fbox{7}", "7"),
        ("$\\boxed 5$", "5"),
        ("\\boxed{unbalanced", None),
        ("no box", None),
    ],
)
def test_last_boxed_only_string(text, expected):
    assert math_score.last_boxed_only_string(text) == expected


@pytest.mark.parametrize(
    ("text", "truth", "expected"),
    [
        ("So $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", 1.0),
        ("\\boxed{0.5}", "\\frac12", 1.0),  # symbolic equivalence
        ("\\boxed{\\dfrac{1}{2}}", "1/2", 1.0),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),
        ("\\fbox{3}", "3", 1.0),
        ("the answer is \\boxed 9", "9", 1.0),
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{\\text{(B)}}", "\\text{(B)}", 1.0),
        ("\\boxed{4}", "5", 0.0),
        ("The answer is 5.", "5", 0.0),  # nothing boxed
        ("\\boxed{5", "5", 0.0),  # unbalanced
        ("\\boxed{5}", "\\boxed{5}", 1.0),  # boxed ground truth
    ],
)
def test_math_compute_score(text, truth, expected):
    assert math_score.compute_score(text, truth) == expected


def test_math_think_tags():
    # After "</think>" only the final answer counts ...
    assert math_score.compute_score("<think>maybe \\boxed{4}</think> It is \\boxed{5}.", "5") == 1.0
    assert math_score.compute_score("<think>surely \\boxed{5}</think> It is \\boxed{4}.", "5") == 0.0
    assert math_score.compute_score("<think>it is \\boxed{5}</think> I give up.", "5") == 0.0
    # ... and without "</think>" the whole text is searched (also when "<think>" was opened and truncated).
    assert math_score.compute_score("<think>so \\boxed{5}", "5") == 1.0


def test_math_normalized_fallback():
    assert math_score.normalize_answer("\\left( 1, 2 \\right)") == "(1,2)"
    assert math_score.normalize_answer("x = .5") == "0.5"
    assert math_score.normalize_answer("\\text{10 }\\%") == "10"


def test_math_works_outside_the_main_thread():
    # math_verify's timeouts use SIGALRM, which raises in other threads unless they are disabled.
    results = []
    worker = threading.Thread(target=lambda: results.append(math_score.compute_score("\\boxed{0.5}", "\\frac{1}{2}")))
    worker.start()
    worker.join()
    assert results == [1.0]


@pytest.mark.parametrize(
    "data_source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math500"]
)
def test_default_compute_score_math_sources(data_source):
    assert default_compute_score(data_source, "\\boxed{2}", "2", extra_info={"split": "test"}) == 1.0


@pytest.mark.parametrize("data_source", ["openai/gsm8k", "gsm8k"])
def test_default_compute_score_gsm8k_sources(data_source):
    assert default_compute_score(data_source, "#### 2", "2") == 1.0


def test_default_compute_score_unknown_source():
    with pytest.raises(NotImplementedError, match=r"data_source='my/set'.*'arithmetic'.*custom_reward_function\.path"):
        default_compute_score("my/set", "#### 2", "2")


@pytest.mark.parametrize(("answer", "truth", "expected"), [
    ("\\frac{3}{4}", "0.75", True),
    ("2\\pi", "2 \\cdot \\pi", True),
    ("2x+1", "1+2x", True),
    ("\\frac{\\frac{1}{2}}{3}", "\\frac{1}{6}", True),
    ("\\dfrac{1}{3}", "0.333", False),
    ("\\frac{1}{2}", "\\frac{1}{3}", False),
])
def test_math_sympy_fallback(answer, truth, expected):
    assert math_score.sympy_equal(answer, truth) is expected


@pytest.mark.parametrize("hostile", [
    "__import__('os').system('touch /tmp/quiver_pwned')",  # parse_expr would eval this
    "9^{9^{9^9}}",  # a power tower that would compute for ever
    "1" * 40,
    "ab+c",  # multi-letter names other than the known functions
])
def test_math_sympy_fallback_refuses_what_is_not_plain_arithmetic(hostile):
    assert not math_score.is_safe_plain(math_score.latex_to_plain(hostile))
    assert math_score.sympy_equal(hostile, "1") is False


def test_math500_uses_the_boxed_grader():
    # Quiver's math500 (and Archer's math sets through verl/utils/reward_score/archer.py, test_verl_rules.py).
    assert default_compute_score("math500", "<think>\\boxed{3}</think> so \\boxed{\\frac{6}{8}}", "0.75") == 1.0
    assert default_compute_score("math500", "<think>\\boxed{0.75}</think> so \\boxed{3}", "0.75") == 0.0
