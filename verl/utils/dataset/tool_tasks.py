r"""Synthetic tasks where tools matter, for the agentic recipes' tiny CPU mode and the ARPO demo.

Both tasks use the deep-research answer format (graded by `verl/utils/reward_score/deep_research.py`):
`<think>...</think>`, tool calls `<python>code</python>` / `<search>query</search>` each followed by the tool's
` <result>\n...\n</result>`, and the final `<answer>\boxed{...}</answer>`.

- **tool_arithmetic**: "What is 4821 * 377?" -- a product too long for a tiny model to work out in its head, one line
  of python for a model that delegates. SFT demonstrations (`sft_train.parquet`) answer part of the questions at once
  (mostly wrong after a short SFT) and the rest through the python tool: whether to call the tool is what RL learns.
- **deep_research** (tiny deep search): questions about made-up countries whose facts exist only in `corpus.jsonl`
  (searched by the BM25 search tool): "What is the capital of Veltria?" needs search; "What is 3 times the population
  of Ostmar?" needs search and python (the multi-tool bonus applies).

Rows follow verl's parquet schema (data_source, prompt, ability, reward_model.ground_truth, extra_info with the SFT
target in `extra_info.response`). The split is by question hash, as in `arithmetic.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random

import pandas as pd

SYSTEM_PROMPT = ("Think in <think></think>. To run code write <python>code</python>; to search write "
                 "<search>query</search>; results come back in <result></result>. End with <answer>\\boxed{X}</answer>.")
ARITHMETIC_SOURCE = "tool_arithmetic"
SEARCH_SOURCE = "deep_research"
TEST_FRACTION = 0.125
SFT_TOOL_FRACTION = 0.5  # share of arithmetic demonstrations that call the python tool
MULTIPLIER = 3  # "What is 3 times the population of X?"
_SYLLABLES = ("vel", "tri", "os", "mar", "qu", "ell", "dor", "an", "ka", "zi", "lo", "ren", "bra", "sul", "te", "min")


def make_messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def result_block(text: str) -> str:
    """What the agent loop appends after a tool call (kept identical here so demonstrations match rollouts)."""
    return f" <result>\n{text}\n</result>"


def _in_test(key: str, seed: int) -> bool:
    digest = hashlib.sha256(f"tool_tasks/{seed}/{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < TEST_FRACTION * 2**64


def _row(source: str, question: str, answer: str, split: str, index: int, response: str, ability: str) -> dict:
    return {"data_source": source, "prompt": make_messages(question), "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "question": question, "response": response}}


# ---------------------------------------------------------------------------------------------- tool arithmetic
def make_tool_arithmetic_rows(n: int, split: str = "train", seed: int = 0,
                              digits: tuple[int, int] = (4, 3)) -> list[dict]:
    """`n` products a * b (a and b with `digits` digits) of the split; each row's `extra_info.response` is a
    demonstration that calls the python tool, `extra_info.direct` one that answers at once."""
    rng = random.Random(f"{ARITHMETIC_SOURCE}/{split}/{seed}")
    rows = []
    while len(rows) < n:
        a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for d in digits)
        if split in ("train", "test") and _in_test(f"{a}*{b}", seed) != (split == "test"):
            continue
        product = str(a * b)
        tool = (f"<think>Use python.</think>\n<python>print({a} * {b})</python>"
                + result_block(product) + f"\n<answer>\\boxed{{{product}}}</answer>")
        row = _row(ARITHMETIC_SOURCE, f"What is {a} * {b}?", product, split, len(rows), tool, "math")
        row["extra_info"]["direct"] = f"<think>Answer now.</think>\n<answer>\\boxed{{{product}}}</answer>"
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- tiny deep search
def make_world(n_countries: int = 48, seed: int = 0) -> list[dict]:
    """Made-up countries with a capital and the capital's population (no model can know them)."""
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


def make_search_corpus(world: list[dict]) -> list[dict]:
    """Two passages per country for the BM25 search tool: its capital, and the capital's population."""
    corpus = []
    for i, entry in enumerate(world):
        corpus.append({"id": f"c{i}", "title": entry["country"],
                       "text": f"The capital of {entry['country']} is {entry['capital']}."})
        corpus.append({"id": f"p{i}", "title": entry["capital"],
                       "text": f"{entry['capital']} has a population of {entry['population']} people."})
    return corpus


def make_deep_search_rows(world: list[dict], split: str = "train", seed: int = 0, search=None) -> list[dict]:
    """Every question of the split: the capital of each country (search) and 3x its capital's population (search,
    then python). `search(query) -> result text` makes the demonstrations show what the search tool returns (pass
    the BM25 SearchTool's execute); without it the demonstrations show the matching passage alone."""
    rows = []
    for entry in world:
        country, capital, population = entry["country"], entry["capital"], entry["population"]
        questions = [
            (f"What is the capital of {country}?", capital, f"capital of {country}", None),
            (f"What is {MULTIPLIER} times the population of {capital}?", str(MULTIPLIER * population),
             f"population of {capital}", f"print({MULTIPLIER} * {population})"),
        ]
        for question, answer, query, code in questions:
            if split in ("train", "test") and _in_test(question, seed) != (split == "test"):
                continue
            found = search(query) if search else f"Page 1: {_passage(entry, query)}"
            response = (f"<think>Search it.</think>\n<search>{query}</search>" + result_block(found))
            if code:
                response += (f"\n<think>Multiply.</think>\n<python>{code}</python>"
                             + result_block(str(MULTIPLIER * population)))
            response += f"\n<answer>\\boxed{{{answer}}}</answer>"
            row = _row(SEARCH_SOURCE, question, answer, split, len(rows), response, "qa")
            row["extra_info"]["direct"] = None  # the same columns as the arithmetic rows
            rows.append(row)
    return rows


def _passage(entry: dict, query: str) -> str:
    if query.startswith("capital"):
        return f"{entry['country']}: The capital of {entry['country']} is {entry['capital']}."
    return f"{entry['capital']}: {entry['capital']} has a population of {entry['population']} people."


# ---------------------------------------------------------------------------------------------- files
def sft_rows(rows: list[dict], seed: int = 0, tool_fraction: float = SFT_TOOL_FRACTION) -> list[dict]:
    """prompt + response rows for `verl.trainer.fsdp_sft_trainer`; arithmetic rows use the tool with probability
    `tool_fraction`, otherwise they answer at once."""
    rng = random.Random(f"tool_tasks/sft/{seed}")
    out = []
    for row in rows:
        info = row["extra_info"]
        direct = bool(info.get("direct")) and rng.random() >= tool_fraction
        out.append({"prompt": row["prompt"], "response": info["direct"] if direct else info["response"]})
    return out


def write_tool_task_files(out_dir: str, arithmetic_train: int = 512, arithmetic_test: int = 64,
                          n_countries: int = 48, seed: int = 0, search_max_results: int = 2,
                          digits: tuple[int, int] = (4, 3)) -> dict[str, str]:
    """Write train.parquet and test.parquet (both tasks, shuffled), sft_train.parquet and corpus.jsonl under
    `out_dir`; returns their paths by name. Search demonstrations show what the BM25 search tool returns with
    `max_results=search_max_results` (give the tool the same setting in training)."""
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
            pd.DataFrame(sft_rows(rows, seed)).to_parquet(paths["sft_train.parquet"], index=False)
    return paths
