"""Under verl 0.9.1's data-source names, verl 0.9.1's numbers: each rule on edge cases whose expected values were
worked out by hand from verl's rule (verl is not installed here), and the router sending every verl name to it."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from json_stub import JsonStub

from verl.utils.reward_score import (
    archer,
    default_compute_score,
    geo3k,
    get_default_compute_score,
    gsm8k,
    gsm8k_numeric,
    math_batch,
    math_dapo,
    math_reward,
    math_verify,
    prime_code,
    prime_math,
    sandbox_fusion,
    scorer_module,
    search_r1_like_qa_em,
)
from verl.utils.sandbox import SandboxLimits, run_python

# ------------------------------------------------------------------ the router

VERL_NAMES = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math_reward",
    "DigitalLearningGmbH/MATH-lighteval": "math_reward",
    "HuggingFaceH4/MATH-500": "math_reward",
    "math_dapo": "math_dapo",
    "math": "math_dapo",
    "math_dapo_reasoning": "math_dapo",
    "aime2024": "math_dapo",
    "aime2025": "math_dapo",
    "aime24": "math_dapo",
    "aime": "math_dapo",
    "numina_aops_forum": "prime_math",
    "numina_synthetic_math": "prime_math",
    "numina_amc_aime": "prime_math",
    "numina_synthetic_amc": "prime_math",
    "numina_cn_k12": "prime_math",
    "numina_olympiads": "prime_math",
    "codecontests": "competition_code",
    "apps": "competition_code",
    "codeforces": "competition_code",
    "taco": "competition_code",
    "hiyouga/geometry3k": "geo3k",
    "searchR1_nq": "search_r1_like_qa_em",
    "searchR1_triviaqa": "search_r1_like_qa_em",
    "searchR1_popqa": "search_r1_like_qa_em",
    "searchR1_hotpotqa": "search_r1_like_qa_em",
    "searchR1_2wikimultihopqa": "search_r1_like_qa_em",
    "searchR1_musique": "search_r1_like_qa_em",
    "searchR1_bamboogle": "search_r1_like_qa_em",
}


@pytest.mark.parametrize(("data_source", "module"), sorted(VERL_NAMES.items()))
def test_every_verl_name_goes_to_the_verl_rule(data_source, module):
    assert scorer_module(data_source) == module


@pytest.mark.parametrize(("data_source", "module"), [("gsm8k", "gsm8k_numeric"), ("math500", "math"),
                                                     ("prime_math", "math"), ("livecodebench", "code")])
def test_quiver_names_keep_quiver_rules(data_source, module):
    assert scorer_module(data_source) == module


def test_router_returns_verl_types():
    assert default_compute_score("openai/gsm8k", "#### 24", "24") == 1.0
    assert default_compute_score("numina_olympiads", "The answer is 3/4", "\\frac34") == 1.0  # (True, ...) -> 1.0
    assert default_compute_score("math", "Answer: 7", "7") == {"score": 1.0, "acc": True, "pred": "7"}
    assert get_default_compute_score("naive") is default_compute_score


# ------------------------------------------------------------------ openai/gsm8k


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so 24 in all.\n#### 24", "24", 1.0),
        ("#### 1,024", "1024", 1.0),  # commas removed from the strict answer
        ("#### 5\nno wait\n#### 24", "24", 1.0),  # the last "#### " counts
        ("#### -3", "-3", 1.0),
        ("####24", "24", 0),  # no space: no strict answer
        ("#### $24", "24", 0),  # "$" is not a digit: no strict answer
        ("#### 24.0", "24", 0.0),  # strings, not numbers
        ("#### 24.", "24", 0.0),
        ("#### 024", "24", 0.0),
        ("#### 24", "24.0", 0.0),
        ("#### 24" + " and that is my final answer." * 11, "24", 0),  # more than 300 characters before the end
        ("#### 24", 24, 0.0),  # an int ground truth matches no string
        ("#### 25", "24", 0.0),
        ("The answer is 24", "24", 0),
    ],
)
def test_gsm8k_strict(response, truth, expected):
    score = gsm8k.compute_score(response, truth)
    assert score == expected and type(score) is type(expected)
    assert default_compute_score("openai/gsm8k", response, truth) == expected


def test_gsm8k_scores_and_flexible_method():
    assert gsm8k.compute_score("#### 25", "24", format_score=0.1) == 0.1
    assert gsm8k.compute_score("####24", "24", format_score=0.1) == 0  # nothing extracted: 0, not format_score
    assert gsm8k.compute_score("#### 24", "24", score=2.0) == 2.0
    assert gsm8k.compute_score("3 + 4 makes 24 .", "24", method="flexible") == 1.0  # a lone "." is skipped
    assert gsm8k.extract_solution("so 24.", method="flexible") == "24."  # "24." is not a lone "."
    assert gsm8k.compute_score("it is 1,024", "1024", method="flexible") == 0.0  # flexible keeps the commas
    assert gsm8k.extract_solution(". . .", method="flexible") == "."
    assert gsm8k.extract_solution("x #### -3,000.5 y") == "-3000.5"
    with pytest.raises(ValueError, match="method='loose'"):
        gsm8k.compute_score("#### 7", "7", method="loose")


@pytest.mark.parametrize("response", ["####24", "#### 24.0", "#### $24", "#### 024", "#### 24"])
def test_quiver_gsm8k_name_compares_numbers(response):
    assert gsm8k_numeric.compute_score(response, "24") == 1.0
    assert default_compute_score("gsm8k", response, "24.0") == 1.0


# ------------------------------------------------------------------ MATH (math_reward)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("So $\\boxed{\\frac12}$.", "\\frac{1}{2}", 1.0),  # \frac12 expanded
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),  # "0.5" is written \frac{1}{2}
        ("\\boxed{1/2}", "\\frac{1}{2}", 1.0),  # a/b of integers
        ("\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
        ("\\boxed{x = 3}", "3", 1.0),  # "k = v" keeps v
        ("\\boxed{10\\%}", "10", 1.0),
        ("\\boxed{5 \\text{ cm}}", "5", 1.0),  # units after "\text{ " dropped
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{\\sqrt2}", "\\sqrt{2}", 1.0),
        ("$\\boxed 3$", "3", 1.0),
        ("\\boxed 3$ then \\boxed{4}", "3", 1.0),  # any "\boxed " wins over a later \boxed{}
        ("\\boxed{0.50}", "\\frac{1}{2}", 0.0),  # no symbolic equivalence
        ("\\boxed{x+1}", "1+x", 0.0),
        ("\\boxed{.5}", "\\frac{1}{2}", 1.0),  # ".5" -> "0.5" -> \frac{1}{2}
        ("\\fbox{3}", "3", 0.0),  # found, but remove_boxed wants \boxed
        ("\\boxed{3", "3", 0.0),  # unbalanced
        ("The answer is 3.", "3", 0.0),
    ],
)
def test_math_reward(response, truth, expected):
    assert math_reward.compute_score(response, truth) == expected
    assert default_compute_score("HuggingFaceH4/MATH-500", response, truth) == expected


def test_math_reward_helpers():
    assert math_reward.last_boxed_only_string("a \\boxed{\\frac{1}{2}} b") == "\\boxed{\\frac{1}{2}}"
    assert math_reward.last_boxed_only_string("\\fbox{7}") == "\\fbox{7}"
    assert math_reward.last_boxed_only_string("no box") is None
    assert math_reward.remove_boxed("\\boxed{7}") == "7" and math_reward.remove_boxed("\\boxed 7") == "7"
    assert math_reward.is_equiv(None, None) and not math_reward.is_equiv("1", None)
    assert math_reward.is_equiv("\\sqrt", "\\sqrt")  # strip_string fails ("\sqrt" at the end): raw comparison
    assert math_reward.strip_string("\\left( 1, 2 \\right)") == "(1,2)"


def test_math_batch_grades_each_row_with_math_reward():
    responses = ["\\boxed{0.5}", "\\boxed{0.50}"]
    assert math_batch.compute_score_batched(["lighteval/MATH"] * 2, responses, ["\\frac12"] * 2, [{}, {}]) == [1.0, 0.0]


# ------------------------------------------------------------------ math_dapo, math, aime*


def graded(score: float, pred: str | None) -> dict:
    return {"score": score, "acc": score == 1.0, "pred": pred}


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("\\boxed{12}", "12", graded(1.0, "12")),
        ("\\boxed{ 12 }", "12", graded(-1.0, " 12 ")),  # the boxed fallback compares raw strings
        ("\\boxed{1,000}", "1000", graded(-1.0, "1,000")),
        ("\\boxed{\\frac12}", "\\frac{1}{2}", graded(-1.0, "\\frac12")),
        ("\\boxed 12", "12", graded(-1.0, "[INVALID]")),  # only \boxed{ counts
        ("\\fbox{12}", "12", graded(-1.0, "[INVALID]")),
        ("Answer: \\frac12", "\\frac{1}{2}", graded(1.0, "\\frac{1}{2}")),  # the answer line is normalised
    ],
)
def test_math_dapo_boxed_fallback_is_verls(response, truth, expected):
    assert math_dapo.compute_score(response, truth) == expected
    for source in ("math", "aime2024", "aime2025", "math_dapo_reasoning"):
        assert default_compute_score(source, response, truth) == expected


def test_math_dapo_strict_box_verify():
    assert math_dapo.compute_score("Answer: 12", "12", strict_box_verify=True) == graded(-1.0, None)
    assert math_dapo.compute_score("Answer: 13 \\boxed{12}", "12", strict_box_verify=True) == graded(1.0, "12")
    text = "\\boxed{12}" + "x" * 200
    assert math_dapo.compute_score(text, "12", pause_tokens_index=[0, 1, 2, 100]) == graded(1.0, "12")
    # the window starts 100 characters before the last pause token: before 0, Python counts from the end
    assert math_dapo.compute_score(text, "12", pause_tokens_index=[0, 1, 2, 50]) == graded(-1.0, "[INVALID]")
    assert math_dapo.verify("Answer: 5", "5") == (True, "5")


# ------------------------------------------------------------------ numina_* (prime_math)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("The answer is 3/4", "\\frac34", 1.0),  # no box needed: the text after "answer is"
        ("x = 3 or x = 5", "5", 1.0),  # after the last "="
        ("So $x = \\boxed{\\frac{1}{2}}$.", "0.5", 1.0),
        ("\\boxed{x^2+1}", "1+x^2", 1.0),  # sympy on the PRM800K forms
        ("\\boxed{2\\pi}", "2\\pi", 1.0),
        ("\\boxed{(0, 2\\pi)}", "(0,2\\pi)", 1.0),
        ("\\boxed{Interval(0, 1)}", "[0,1]", 1.0),
        ("\\boxed{50\\%}", "0.5", 1.0),
        ("\\boxed{50}", "0.5", 1.0),  # numbers also match the ground truth * 100 or / 100
        ("\\boxed{6.28}", "2\\pi", 1.0),  # \pi evaluated, then within 1e-4 relative (with pi = 3.14)
        ("\\boxed{10_2}", "10", 1.0),  # a number in base 2 keeps its digits
        ("\\boxed{0.333}", "\\frac{1}{3}", 0.0),
        ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 0.0),  # an unreduced fraction is not the reduced one
        ("<think>\\boxed{0.5}</think> \\boxed{2}", "0.5", 0.0),
        ("So x is 0.5.", "0.5", 0.0),  # "0.5." is not a number
    ],
)
def test_prime_math(response, truth, expected):
    assert float(prime_math.compute_score(response, truth)[0]) == expected
    assert default_compute_score("numina_cn_k12", response, truth) == expected


def test_prime_math_returns_verls_triple_and_evaluates_only_arithmetic():
    assert prime_math.compute_score("Step 1: x. Step 2: so \\boxed{4}", "4") == (True, True, "4")
    assert prime_math.compute_score("answer: 5", "4") == (False, False, "5")
    assert prime_math.match_answer("Thus the answer is 12. Done") == (True, "12")
    assert prime_math.evaluate_arithmetic("(1, 2*3.5)") == (1, 7.0)
    for hostile in ("__import__('os').getcwd()", "9**9**9**9", "[x for x in ()]"):
        with pytest.raises(ValueError):
            prime_math.evaluate_arithmetic(hostile)
    assert prime_math.compute_score("\\boxed{__import__('os')\\pi}", "1")[0] is False


# ------------------------------------------------------------------ codecontests, apps, codeforces, taco

SUM = json.dumps({"inputs": ["3\n1 2 3\n", "2\n5 5\n", "1\n-4\n"], "outputs": ["6\n", "10\n", "-4\n"]})
ADD = json.dumps({"fn_name": "add", "inputs": ["1\n2", "[1]\n[2, 3]"], "outputs": ["3", "[[1, 2, 3]]"]})


def fenced(code: str) -> str:
    return f"Here it is.\n```python\n{code}\n```"


@pytest.mark.parametrize(
    ("response", "tests", "expected"),
    [
        (fenced("n = int(input())\nprint(sum(map(int, input().split())))"), SUM, 1.0),
        (fenced("n = int(input())\ns = sum(map(int, input().split()))\nprint(max(s, 0))"), SUM, 2 / 3),
        (fenced("import sys\ndata = sys.stdin.buffer.read().split()\nprint(sum(map(int, data[1:])))"), SUM, 0.0),
        (fenced("n = int(input())\nprint(sum(map(int, input().split())))\nexit()"), SUM, 0.0),  # exit() is disabled
        (fenced("import sys\nn = int(input())\nprint(sum(map(int, input().split())))\nsys.exit(0)"), SUM, 1.0),
        ("n = int(input())\nprint(sum(map(int, input().split())))", SUM, 1.0),  # no fence: the whole response
        ("I cannot solve this.", SUM, 0.0),
        # TACO's lists of lines are not text: that test fails
        (fenced("n = int(input())\nprint(sum(map(int, input().split())))"),
         json.dumps({"inputs": [["3", "1 2 3"], "2\n5 5\n"], "outputs": [["6"], "10\n"]}), 0.5),
        (fenced("def add(a, b):\n    return a + b"), ADD, 1.0),  # [1, 2, 3] matches [[1, 2, 3]]'s only element
        (fenced("def add(a, b):\n    return a - b if a == 1 else a + b"), ADD, 0.0),  # call-based: all or nothing
        (fenced("def plus(a, b):\n    return a + b"), ADD, 1.0),  # the prelude's `from operator import *`: add
        (fenced("print(1)"), json.dumps({"inputs": [], "outputs": []}), 1.0),  # no tests: all passed
    ],
)
def test_competition_code_continuous_score(response, tests, expected):
    assert default_compute_score("taco", response, tests) == pytest.approx(expected)


def test_prime_code_details_and_non_continuous():
    right = fenced("n = int(input())\nprint(sum(map(int, input().split())))")
    assert prime_code.compute_score(right, json.loads(SUM)) == (True, [{"test": i, "passed": True} for i in range(3)])
    half = fenced("n = int(input())\ns = sum(map(int, input().split()))\nprint(max(s, 0))")
    assert prime_code.compute_score(half, SUM)[0] is False
    assert prime_code.compute_score(right, "not json") == (False, [])
    assert prime_code.stdout_matches("6 \n\n", "6\n") and not prime_code.stdout_matches("1.1\n", "1\n")
    assert prime_code.stdout_matches("2\n", "2.0\n")  # not all digit strings: compared as floats (numpy's allclose)
    assert prime_code.stdout_matches("1.000001\n", "1\n")  # within rtol 1e-5
    assert prime_code.return_matches('{"tuple": [1, 2]}', "[1, 2]")


# ------------------------------------------------------------------ sandbox_fusion (a stub server on 127.0.0.1)


def run_code(path, payload):
    """A SandboxFusion server's answer: the program run in Quiver's own sandbox."""
    files = {name: base64.b64decode(text).decode() for name, text in payload["files"].items()}
    run = run_python(payload["code"], stdin=payload.get("stdin") or "", files=files,
                     limits=SandboxLimits(wall_time_s=payload["run_timeout"]))
    return 200, {"status": "Success" if run.ok else "Failed",
                 "run_result": {"status": "Finished", "return_code": run.returncode, "stdout": run.stdout,
                                "stderr": run.stderr, "execution_time": run.wall_time_s}}


@pytest.fixture()
def stub():
    with JsonStub(run_code) as server:
        yield server


def test_sandbox_fusion_rule(stub):
    server = stub.url
    half = fenced("n = int(input())\ns = sum(map(int, input().split()))\nprint(max(s, 0))")
    assert default_compute_score("codecontests", half, SUM, sandbox_fusion_url=server) == pytest.approx(2 / 3)
    assert sorted(r["stdin"] for r in stub.payloads) == ["1\n-4\n", "2\n5 5\n", "3\n1 2 3\n"]  # one per test
    score, passed = sandbox_fusion.compute_score(server, None, None, "```cpp\nprint(6)\n```", SUM)
    assert (score, passed) == (pytest.approx(1 / 3), [True, False, False])  # a bare-word first line is a tag
    assert sandbox_fusion.compute_score(server, None, None, "print(6)", SUM) == (0.0, [])  # no fence
    add = fenced("def add(a, b):\n    return a + b")
    calls = json.dumps({"fn_name": "add", "inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"]})
    assert sandbox_fusion.compute_score(server, None, None, add, calls, continuous=True)[0] == 1.0
    asserts = {"assert_case": ["assert add(1, 2) == 3", "assert add(1, 2) == 4"]}
    assert sandbox_fusion.compute_score(server, None, None, add, asserts)[0] == 0.5


# ------------------------------------------------------------------ hiyouga/geometry3k


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("<think>angles</think> so \\boxed{3}", "3", 1.0),
        ("so \\boxed{3}", "3", 0.9),  # no <think>: no format credit
        ("<think>angles</think> so \\boxed{4}", "3", 0.1),
        ("<think>angles</think> so 3", "3", 0.0),
        ("<think>a</think> \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ],
)
def test_geo3k(response, truth, expected):
    assert geo3k.compute_score(response, truth) == pytest.approx(expected)
    assert default_compute_score("hiyouga/geometry3k", response, truth) == pytest.approx(expected)


# ------------------------------------------------------------------ searchR1_*


def test_search_r1_like_qa_em():
    answer = "<answer>The Eiffel Tower</answer>"
    assert default_compute_score("searchR1_popqa", answer, {"target": np.array(["Eiffel Tower"])}) == 1.0
    assert search_r1_like_qa_em.compute_score("<answer>x</answer>", {"target": "y"}, format_score=0.2) == 0.2
    assert search_r1_like_qa_em.compute_score("x", {"target": "y"}, format_score=0.2) == 0
    assert search_r1_like_qa_em.compute_score(answer + "<answer>" * 11, {"target": ["eiffel tower"]}) == 0.25
    one_answer = {"target": '["1990", "1991"]'}  # a string target is one answer, even when it looks like a list
    assert search_r1_like_qa_em.compute_score("<answer>1990</answer>", one_answer) == 0.0
    assert search_r1_like_qa_em.compute_score_subem("<answer>the tall Eiffel Tower</answer>",
                                                    {"target": ["Eiffel Tower"]}) == 1.0
    assert search_r1_like_qa_em.em_check("Paris!", "paris") == 1 and search_r1_like_qa_em.subem_check("a", ["b"]) == 0


# ------------------------------------------------------------------ math_verify and Archer's math sets


def test_math_verify_module():
    assert math_verify.compute_score("so \\boxed{0.5}", "\\frac{1}{2}") == 1.0
    assert math_verify.compute_score("no answer", "2") == 0.0


@pytest.mark.parametrize("source", ["math", "aime2024", "aime2025", "math500"])
def test_archer_keeps_its_boxed_grader(source):
    response = "<think>\\boxed{3}</think> so \\boxed{\\frac{6}{8}}"
    assert archer.compute_score(source, response, "0.75") == 1.0
    assert archer.compute_score(source, "Answer: 0.75", "0.75") == 0.0
    assert archer.compute_score("openai/gsm8k", "#### 24", "24") == 1.0  # other names: the default router

