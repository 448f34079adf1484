"""verl/utils/reward_score/llm_judge.py against a scripted OpenAI-compatible server on 127.0.0.1 (tests/openai_stub.py):
verdict parsing, the rule shortcut, the cache (a rerun makes no request), and failures that end in a clear error."""

from __future__ import annotations

import time

import pytest
from openai_stub import OpenAIStub

from verl.utils.json_cache import JsonCache
from verl.utils.openai_endpoint import Endpoint, EndpointConfig, EndpointError
from verl.utils.reward_score.llm_judge import JudgeItem, LLMJudge, judge_prompt, model_answer, parse_verdict


@pytest.mark.parametrize(("reply", "verdict"), [
    ("Correct", True),
    ("correct", True),
    ("CORRECT.", True),
    ("**Correct**", True),
    ("Verdict: Correct!", True),
    ("[[Correct]]", True),
    ("  \n Correct\n", True),
    ("Incorrect", False),
    ("incorrect.", False),
    ("INCORRECT", False),
    ("Not correct.", False),
    ("Incorrect. The correct answer is Paris.", False),  # the first verdict word decides
    ("Correct - although an incorrect unit is written, the value matches.", True),
    ("<think>Is it correct? The reference says 3.</think>\nIncorrect", False),  # the reasoning is skipped
    ("<think>unfinished reasoning, correct so far", None),  # cut off inside the reasoning
    ("The answers match.", None),
    ("Correctness cannot be judged", None),  # "correctness" is not the word "correct"
    ("", None),
])
def test_verdict_parsing(reply, verdict):
    assert parse_verdict(reply) is verdict


def test_the_prompt_and_the_answer_shown():
    prompt = judge_prompt(" Capital of France? ", ["Paris", "Paris, France"], " the city of Paris ")
    assert "Question: Capital of France?\n" in prompt
    assert "Reference answer: Paris (or: Paris, France)\n" in prompt
    assert "Answer to check: the city of Paris\n" in prompt and prompt.endswith("Correct or Incorrect.")
    assert model_answer("<think>a</think><answer>so \\boxed{42}</answer>") == "42"
    last_five = "line 2\nline 3\nline 4\nline 5\nline 6"
    assert model_answer("line 1\n\n" + last_five + "\n") == last_five


def reply_paris(messages: list[dict]) -> str:
    """A scripted judge: correct when the checked answer names Paris."""
    checked = messages[0]["content"].split("Answer to check:")[1].split("\n")[0]
    return "Correct." if "paris" in checked.lower() else "**Incorrect**"


def items() -> list[JudgeItem]:
    question, refs = "What is the capital of France?", ("Paris",)
    return [
        JudgeItem(question, refs, "<answer>\\boxed{the city of Paris}</answer>", "qa"),  # judge: correct
        JudgeItem(question, refs, "<answer>\\boxed{Lyon}</answer>", "qa"),  # judge: incorrect
        JudgeItem(question, refs, "<answer>\\boxed{PARIS.}</answer>", "qa"),  # equal by rule: no call
        JudgeItem(question, refs, "   ", "qa"),  # no answer: no call
        JudgeItem(question, refs, "I think it is Lyon", "qa"),  # no \boxed: the last lines go to the judge
        JudgeItem(question, refs, "<answer>\\boxed{Lyon}</answer>", "qa"),  # asked above: no second call
        JudgeItem("1/2 as a decimal?", ("0.5",), "<answer>\\boxed{\\frac{1}{2}}</answer>", "math"),  # math rule
    ]


def judge_for(stub: OpenAIStub, cache: JsonCache | None = None, **endpoint) -> LLMJudge:
    config = EndpointConfig(base_url=stub.url, **{"model": stub.model, "max_retries": 0, "timeout_s": 5.0, **endpoint})
    return LLMJudge(Endpoint(config), cache)


def test_verdicts_and_a_rerun_from_the_cache_makes_no_request(tmp_path):
    cache_file = tmp_path / "judge_cache.json"
    with OpenAIStub(reply=reply_paris) as stub:
        verdicts = judge_for(stub, JsonCache(str(cache_file))).grade(items())
        assert [(v.correct, v.status) for v in verdicts] == [
            (True, "judge_correct"), (False, "judge_incorrect"), (True, "rule_equal"), (False, "no_answer"),
            (False, "judge_incorrect"), (False, "judge_incorrect"), (True, "rule_equal")]
        assert verdicts[4].answer == "I think it is Lyon" and verdicts[1].reply == "**Incorrect**"
        assert len(stub.chat_requests) == 3  # the two boxed answers and the last-lines one
        assert all(body["temperature"] == 0.0 and body["max_tokens"] == 128 for body in stub.chat_requests)

        again = judge_for(stub, JsonCache(str(cache_file))).grade(items())  # a new run: a new cache object
        assert again == verdicts and len(stub.requests) == 3  # no request of any kind
        assert len(JsonCache(str(cache_file))) == 3

        other_model = judge_for(stub, JsonCache(str(cache_file)), model="another-judge")
        other_model.grade(items()[:1])
        assert len(stub.chat_requests) == 4  # the judge model is part of the key


def test_an_unparseable_reply_counts_as_incorrect():
    with OpenAIStub(reply=lambda messages: "I cannot tell.") as stub:
        (verdict,) = judge_for(stub).grade(items()[:1])
    assert (verdict.correct, verdict.status, verdict.reply) == (False, "judge_unparsed", "I cannot tell.")


def test_http_500_is_retried_then_a_clear_error(tmp_path):
    cache_file = tmp_path / "judge_cache.json"
    with OpenAIStub(reply=reply_paris) as stub:
        stub.status = 500
        start = time.monotonic()
        with pytest.raises(EndpointError, match=rf"{stub.url}: a chat completion failed with HTTP 500 after 2 retries"):
            judge_for(stub, JsonCache(str(cache_file)), max_retries=2).grade(items()[:1])
        assert len(stub.chat_requests) == 3 and time.monotonic() - start < 20


def test_a_timeout_is_retried_then_a_clear_error():
    with OpenAIStub(reply=reply_paris) as stub:
        stub.delay_s = 2.0
        start = time.monotonic()
        with pytest.raises(EndpointError, match=r"timed out \(0.2 s per request, 1 retries\)"):
            judge_for(stub, max_retries=1, timeout_s=0.2).grade(items()[:1])
        assert len(stub.chat_requests) == 2 and time.monotonic() - start < 10  # never a hang


def test_an_unreachable_judge_is_a_clear_error():
    config = EndpointConfig(base_url="http://127.0.0.1:9/v1", model="judge", max_retries=0, timeout_s=2.0)
    with pytest.raises(EndpointError, match="could not connect.*is the server running"):
        LLMJudge(Endpoint(config)).grade(items()[:1])
