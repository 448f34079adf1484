r"""Synthetic tasks where tools matter, for the agentic recipes' tiny CPU mode and the ARPO demo.

Both tasks use the deep-research answer format (graded by `verl/utils/reward_score/deep_research.py`):
`<think>...</think>`, tool calls `<python>code</python>` / `<search>query</search>` each followed by the tool's
` <result>\n...\n</result>`, and the final `<answer>\boxed{...}</answer>`. Every prompt is `SYSTEM_PROMPT` plus the
question (`make_messages`); with the tiny tokenizer the prompts stay under 120 tokens.

- **tool_arithmetic**: "What is 4821 * 377?" -- a product too long for a tiny model to work out in its head, one line
  of python for a model that delegates. SFT demonstrations (`sft_train.parquet`) answer part of the questions at once
  (mostly wrong after a short SFT) and the rest through the python tool: whether to call the tool is what RL learns.
- **deep_research** (tiny deep search): questions about made-up countries whose facts exist only in `corpus.jsonl`
  (searched by the BM25 search tool): "What is the capital of Veltria?" needs search; "What is 3 times the population
  of Ostmar?" needs search and python (the multi-tool bonus applies).

Rows follow verl's parquet schema (data_source, prompt, ability, reward_model.ground_truth, extra_info). The SFT
targets are `extra_info.response` (the tool-using demonstration) and `extra_info.direct` (answer at once; arithmetic
only, None for search questions); `tool_sft_text` picks one. The split is by question hash, as in `arithmetic.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re

import pandas as pd

SYSTEM_PROMPT = ("Think in <think></think>; tools: <python>code</python>, <search>query</search>, output "
                 "<result></result>; answer <answer>\\boxed{X}</answer>")
ARITHMETIC_SOURCE = "tool_arithmetic"
SEARCH_SOURCE = "deep_research"
TEST_FRACTION = 0.125
SFT_TOOL_FRACTION = 0.5  # share of arithmetic demonstrations that call the python tool
MULTIPLIER = 3  # "What is 3 times the population of X?"
_SYLLABLES = ("vel", "tri", "os", "mar", "qu", "ell", "dor", "an", "ka", "zi", "lo", "ren", "bra", "sul", "te", "min")


def make_messages(question: str) -> list[dict[str, str]]:
    """The chat prompt of a question: the tool-format system prompt, then the question as the user turn."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def result_block(text: str) -> str:
    """What the agent loop appends after a tool call: `agent_loop.RESULT_TEMPLATE` (a test keeps the two equal; it is
    not imported so that writing data does not import torch), so demonstrations look exactly like rollouts."""
    return f" <result>\n{text}\n</result>"


def _in_test(key: str, seed: int) -> bool:
    digest = hashlib.sha256(f"tool_tasks/{seed}/{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < TEST_FRACTION * 2**64


def _row(source: str, question: str, answer: str, split: str, index: int, response: str, direct: str | None,
         ability: str) -> dict:
    return {"data_source": source, "prompt": make_messages(question), "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "question": question, "response": response,
                           "direct": direct}}


def tool_sft_text(row: dict, use_tool: bool = True) -> str:
    """An SFT target of a row: the demonstration that calls the tools, or (`use_tool=False`, arithmetic rows only)
    the one that answers at once."""
    info = row["extra_info"]
    if use_tool:
        return info["response"]
    if not info.get("direct"):
        raise ValueError(f"row {info['question']!r} ({row['data_source']}) has no direct answer: it needs the tools")
    return info["direct"]


# ---------------------------------------------------------------------------------------------- tool arithmetic
def make_tool_arithmetic_rows(n: int, split: str = "train", seed: int = 0,
                              digits: tuple[int, int] = (4, 3)) -> list[dict]:
    """`n` distinct products a * b (a and b with `digits` digits) of the split ("train", "test", or anything else for
    both); the same arguments always give the same rows."""
    rng = random.Random(f"{ARITHMETIC_SOURCE}/{split}/{seed}")
    rows, seen, draws = [], set(), 0
    while len(rows) < n:
        draws += 1
        if draws > 100 * n + 1000:
            raise ValueError(f"found only {len(rows)} of n={n} distinct {split} products with digits={digits}; "
                             "ask for fewer rows or more digits")
        a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for d in digits)
        question = f"What is {a} * {b}?"
        if question in seen or (split in ("train", "test") and _in_test(f"{a}*{b}", seed) != (split == "test")):
            continue
        seen.add(question)
        product = str(a * b)
        tool = (f"<think>Use python.</think>\n<python>print({a} * {b})</python>"
                + result_block(product) + f"\n<answer>\\boxed{{{product}}}</answer>")
        direct = f"<think>Answer now.</think>\n<answer>\\boxed{{{product}}}</answer>"
        rows.append(_row(ARITHMETIC_SOURCE, question, product, split, len(rows), tool, direct, "math"))
    return rows


# ---------------------------------------------------------------------------------------------- hermes calculator
# The tool-arithmetic task in verl's format (rollout.mode=async, multi_turn.format=hermes): the calculator tool of
# configs/tools/calculator_tool.yaml, called as a hermes <tool_call>, its result a chat-template tool turn.
HERMES_SYSTEM_PROMPT = ('Think in <think></think>; tool: calculator, called as <tool_call>{"name": "calculator", '
                        '"arguments": {"expression": "..."}}</tool_call>; answer <answer>\\boxed{X}</answer>')
_PYTHON_CALL = re.compile(r"<think>Use python\.</think>\n<python>print\((.*?)\)</python> <result>\n(.*?)\n</result>",
                          re.DOTALL)


def hermes_messages(messages: list[dict]) -> list[dict]:
    """A task prompt with the calculator's system prompt instead of the tags' one."""
    return [{"role": "system", "content": HERMES_SYSTEM_PROMPT}, *(m for m in messages if m["role"] != "system")]


def hermes_calculator_response(response: str, tool_turn, eos: str) -> str:
    """A tool-arithmetic demonstration with its python call written as a hermes calculator call: the call, the EOS
    that ends the assistant's turn (`eos`), then `tool_turn([result], eos)` -- the tool turn and the next assistant
    turn's opening, as the agent loop writes them (`HermesFormat.results_text`)."""
    def call(match: re.Match) -> str:
        arguments = json.dumps({"name": "calculator", "arguments": {"expression": match[1]}})
        return (f"<think>Use the calculator.</think>\n<tool_call>{arguments}</tool_call>{eos}"
                + tool_turn([match[2]], eos))
    return _PYTHON_CALL.sub(call, response)


# ---------------------------------------------------------------------------------------------- tiny deep search
def make_world(n_countries: int = 48, seed: int = 0) -> list[dict]:
    """Made-up countries with a capital and the capital's population (no model can know them); all names distinct."""
    rng = random.Random(f"world/{seed}")
    names: set[str] = set()

    def name(parts: int) -> str:
        while True:
            word = "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()
            if word not in names:
                names.add(word)
                return word

    return [{"country": name(3), "capital": name(2), "population": rng.randint(10, 999) * 1000}
            for _ in range(n_countries)]


def _passages(index: int, entry: dict) -> tuple[dict, dict]:
    """The two corpus rows of a country: its capital, and the capital's population."""
    country, capital = entry["country"], entry["capital"]
    return ({"id": f"c{index}", "title": country, "text": f"The capital of {country} is {capital}."},
            {"id": f"p{index}", "title": capital, "text": f"{capital} has a population of {entry['population']} people."})


def make_search_corpus(world: list[dict]) -> list[dict]:
    """The BM25 search tool's corpus: rows {"id", "title", "text"}, two per country (`_passages`)."""
    return [passage for i, entry in enumerate(world) for passage in _passages(i, entry)]


def make_deep_search_rows(world: list[dict], split: str = "train", seed: int = 0, search=None) -> list[dict]:
    """Every question of the split: the capital of each country (search) and 3x its capital's population (search,
    then python). `search(query) -> result text` makes the demonstrations show what the search tool returns (pass
    the BM25 SearchTool's execute); without it they show the matching passage alone, as the tool formats it."""
    rows = []
    for i, entry in enumerate(world):
        capital_passage, population_passage = _passages(i, entry)
        population = entry["population"]
        questions = [  # (question, answer, search query, the passage that answers it, python code)
            (f"What is the capital of {entry['country']}?", entry["capital"], f"capital of {entry['country']}",
             capital_passage, None),
            (f"What is {MULTIPLIER} times the population of {entry['capital']}?", str(MULTIPLIER * population),
             f"population of {entry['capital']}", population_passage, f"print({MULTIPLIER} * {population})"),
        ]
        for question, answer, query, passage, code in questions:
            if split in ("train", "test") and _in_test(question, seed) != (split == "test"):
                continue
            found = search(query) if search else f"Page 1: {passage['title']}: {passage['text']}"
            response = f"<think>Search it.</think>\n<search>{query}</search>" + result_block(found)
            if code:
                response += (f"\n<think>Multiply.</think>\n<python>{code}</python>"
                             + result_block(str(MULTIPLIER * population)))
            response += f"\n<answer>\\boxed{{{answer}}}</answer>"
            rows.append(_row(SEARCH_SOURCE, question, answer, split, len(rows), response, None, "qa"))
    return rows


# ---------------------------------------------------------------------------------------------- files
def sft_rows(rows: list[dict], seed: int = 0, tool_fraction: float = SFT_TOOL_FRACTION) -> list[dict]:
    """prompt + response rows for `verl.trainer.fsdp_sft_trainer`; arithmetic rows use the tool with probability
    `tool_fraction`, otherwise they answer at once; search rows always use the tools."""
    rng = random.Random(f"tool_tasks/sft/{seed}")
    out = []
    for row in rows:
        use_tool = not row["extra_info"]["direct"] or rng.random() < tool_fraction
        out.append({"prompt": row["prompt"], "response": tool_sft_text(row, use_tool)})
    return out


def write_tool_task_files(out_dir: str, arithmetic_train: int = 512, arithmetic_test: int = 64,
                          n_countries: int = 48, seed: int = 0, search_max_results: int = 2,
                          digits: tuple[int, int] = (4, 3), sft_tool_fraction: float = SFT_TOOL_FRACTION
                          ) -> dict[str, str]:
    """Write train.parquet and test.parquet (both tasks, shuffled), sft_train.parquet (prompt, response: the train
    rows' demonstrations, `sft_rows`) and corpus.jsonl under `out_dir`; returns their paths by file name. Search
    demonstrations show what the BM25 search tool returns with `max_results=search_max_results` (give the tool the
    same setting in training)."""
    from verl.workers.tools.search_tool import SearchTool

    os.makedirs(out_dir, exist_ok=True)
    world = make_world(n_countries, seed)
    paths = {name: os.path.join(out_dir, name) for name in
             ("train.parquet", "test.parquet", "sft_train.parquet", "corpus.jsonl")}
    with open(paths["corpus.jsonl"], "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in make_search_corpus(world))
    search = SearchTool(corpus_path=paths["corpus.jsonl"], max_results=search_max_results).execute
    for split, size in (("train", arithmetic_train), ("test", arithmetic_test)):
        rows = make_tool_arithmetic_rows(size, split, seed, digits) + make_deep_search_rows(world, split, seed, search)
        random.Random(f"tool_tasks/{split}/{seed}").shuffle(rows)
        for index, row in enumerate(rows):
            row["extra_info"]["index"] = index
        pd.DataFrame(rows).to_parquet(paths[f"{split}.parquet"], index=False)
        if split == "train":
            pd.DataFrame(sft_rows(rows, seed, sft_tool_fraction)).to_parquet(paths["sft_train.parquet"], index=False)
    return paths
