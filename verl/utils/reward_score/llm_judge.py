"""An LLM judge over an OpenAI-compatible endpoint: is the model's answer the reference answer? (ARPO's `llm_equal`.)

ARPO grades its evaluation runs with a large served model (Qwen2.5-72B-Instruct): the judge sees the question, the
reference answer and the model's answer and says "Correct" or "Incorrect". Its rules, kept here:

- the model's answer is the response's final answer (the last `\\boxed{}` in `<answer>`, else the last `\\boxed{}`),
  else the response's last five lines (`model_answer`); an empty response is incorrect without a call
  (status `no_answer`);
- an answer equal to a reference by rule (`arpo_eval.rule_equal`: math equivalence for math, normalised exact match
  for QA) is correct without a call (status `rule_equal`);
- otherwise the judge's reply decides (`parse_verdict`): status `judge_correct` or `judge_incorrect`, and a reply
  that says neither counts as incorrect with status `judge_unparsed`.

Every reply is kept in a `JsonCache` (verl/utils/json_cache.py) under the key
`["judge", <judge model>, <question>, <references>, <answer>]`, so a rerun asks only what it never asked; the reply is
parsed on every run, so a change of `parse_verdict` applies to cached replies too. An endpoint that fails after its
retries raises `EndpointError` (verl/utils/openai_endpoint.py) once the calls in flight are done; the replies
received so far are saved first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from verl.utils.json_cache import JsonCache, key_of
from verl.utils.openai_endpoint import Endpoint, map_concurrently
from verl.utils.reward_score.arpo_eval import extract_final_answer, rule_equal

JUDGE_PROMPT = """You check answers to questions against a reference answer.

Question: {question}

Reference answer: {reference}

Answer to check: {answer}

Does the answer to check say the same thing as the reference answer? Differences of wording, formatting, letter
case, units written out or rounding that keeps the meaning do not matter; a different value, name or claim does, and
so does an answer that hedges between several options. Reply with one word: Correct or Incorrect."""

# The verdict is the first of these words in the reply (after any <think> block); "not correct" is incorrect.
_VERDICT = re.compile(r"\b(incorrect|not\s+correct|correct)\b")
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
ANSWER_TAIL_LINES = 5


def judge_prompt(question: str, references: list[str], answer: str) -> str:
    """JUDGE_PROMPT filled in; several references read "A (or: B)"."""
    reference = references[0] + "".join(f" (or: {r})" for r in references[1:]) if references else ""
    return JUDGE_PROMPT.format(question=question.strip(), reference=reference.strip(), answer=answer.strip())


def parse_verdict(reply: str) -> bool | None:
    """True for "Correct", False for "Incorrect" (or "not correct"), None when the reply says neither. Case, markup and
    punctuation around the word do not matter; a <think> block is skipped; the first verdict word decides, so
    "Incorrect. The correct answer is X" is incorrect."""
    match = _VERDICT.search(_THINK.sub(" ", reply or "").lower())
    return None if match is None else match.group(1) == "correct"


def model_answer(response: str) -> str:
    """What the judge is shown as the model's answer: the final answer, else the response's last lines."""
    answer = extract_final_answer(response)
    if answer is not None:
        return answer
    lines = [line for line in response.strip().splitlines() if line.strip()]
    return "\n".join(lines[-ANSWER_TAIL_LINES:])


@dataclass(frozen=True)
class JudgeItem:
    """One response to grade: the row's question and references, the response, and the row's task (math / qa)."""

    question: str
    references: tuple[str, ...]
    response: str
    task: str


@dataclass(frozen=True)
class Verdict:
    correct: bool
    status: str  # no_answer, rule_equal, judge_correct, judge_incorrect, judge_unparsed
    answer: str  # the model answer the judge saw (or would have seen)
    reply: str | None = None  # the judge's reply; None when no call was needed


class LLMJudge:
    """Grades `JudgeItem`s with one endpoint, through an optional cache (module docstring)."""

    def __init__(self, endpoint: Endpoint, cache: JsonCache | None = None, temperature: float = 0.0,
                 max_tokens: int = 128):
        self.endpoint, self.cache = endpoint, cache
        self.sampling = {"temperature": temperature, "max_tokens": max_tokens}

    def grade(self, items: list[JudgeItem]) -> list[Verdict]:
        """One verdict per item, in order. Identical questions asked twice make one request."""
        answers = [model_answer(item.response) for item in items]
        # Rule equivalence runs here, in the calling thread: math_verify's time limit needs the main thread's alarm.
        by_rule = [bool(a) and rule_equal(a, list(item.references), item.task) for item, a in zip(items, answers)]
        need = [i for i, answer in enumerate(answers) if answer and not by_rule[i]]
        replies = self._replies({self._key(items[i], answers[i]): (items[i], answers[i]) for i in need})

        verdicts = []
        for i, (item, answer) in enumerate(zip(items, answers)):
            if not answer:
                verdicts.append(Verdict(False, "no_answer", answer))
            elif by_rule[i]:
                verdicts.append(Verdict(True, "rule_equal", answer))
            else:
                reply = replies[self._key(item, answer)]
                correct = parse_verdict(reply)
                status = "judge_unparsed" if correct is None else "judge_correct" if correct else "judge_incorrect"
                verdicts.append(Verdict(bool(correct), status, answer, reply))
        return verdicts

    def _key(self, item: JudgeItem, answer: str) -> str:
        return key_of("judge", self.endpoint.model, item.question, list(item.references), answer)

    def _replies(self, asks: dict[str, tuple[JudgeItem, str]]) -> dict[str, str]:
        """The judge's reply for every key: from the cache, else asked (at most `concurrency` at a time)."""
        replies = {key: self.cache.get(key) for key in asks} if self.cache is not None else dict.fromkeys(asks)
        missing = [key for key, reply in replies.items() if reply is None]

        def ask(key: str) -> str:
            item, answer = asks[key]
            prompt = judge_prompt(item.question, list(item.references), answer)
            reply = self.endpoint.chat([{"role": "user", "content": prompt}], **self.sampling)
            if self.cache is not None:
                self.cache.put(key, reply)
            return reply

        try:
            replies.update(zip(missing, map_concurrently(ask, missing, self.endpoint.config.concurrency,
                                                         desc=f"judging ({self.endpoint.model})" if missing else None)))
        finally:
            if self.cache is not None:
                self.cache.save()
        return replies
