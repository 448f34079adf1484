"""The synthetic tool tasks: schema, splits, ground truths, and demonstrations that the reward and the tools agree with."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from verl.demo.tool_tasks import (
    ARITHMETIC_SOURCE,
    SEARCH_SOURCE,
    SYSTEM_PROMPT,
    make_deep_search_rows,
    make_messages,
    make_search_corpus,
    make_tool_arithmetic_rows,
    make_world,
    result_block,
    tool_sft_text,
    write_tool_task_files,
)
from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.deep_research import validate_format
from verl.workers.tools.search_tool import SearchTool

MAX_PROMPT_TOKENS = 120  # the tiny model's prompts must stay short (the agentic tiny recipes allow 160)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_tool_task_files(str(tmp_path_factory.mktemp("tool_tasks")), arithmetic_train=64,
                                 arithmetic_test=16, n_countries=12)


def test_arithmetic_rows_are_deterministic_disjoint_and_right():
    train, test = make_tool_arithmetic_rows(50, "train"), make_tool_arithmetic_rows(20, "test")
    assert train == make_tool_arithmetic_rows(50, "train")
    assert train != make_tool_arithmetic_rows(50, "train", seed=1)
    questions = {r["extra_info"]["question"] for r in train}
    assert len(questions) == 50 and not questions & {r["extra_info"]["question"] for r in test}
    for row in train:
        a, b = (int(x) for x in row["extra_info"]["question"][len("What is "):-1].split(" * "))
        assert 1000 <= a <= 9999 and 100 <= b <= 999
        assert row["reward_model"]["ground_truth"] == str(a * b)
        assert f"<python>print({a} * {b})</python>" + result_block(str(a * b)) in row["extra_info"]["response"]


def test_too_many_arithmetic_rows_for_the_digits_is_an_error():
    with pytest.raises(ValueError, match="distinct test products"):
        make_tool_arithmetic_rows(81, "test", digits=(1, 1))  # 81 products in all, about 10 in the test split


def test_row_schema():
    row = make_tool_arithmetic_rows(1)[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["prompt"] == make_messages(row["extra_info"]["question"])
    assert row["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert row["reward_model"]["style"] == "rule"
    assert set(row["extra_info"]) == {"split", "index", "question", "response", "direct"}
    assert tool_sft_text(row) == row["extra_info"]["response"]
    assert tool_sft_text(row, use_tool=False) == row["extra_info"]["direct"]
    search_row = make_deep_search_rows(make_world(2), "all")[0]
    assert set(search_row["extra_info"]) == set(row["extra_info"])
    with pytest.raises(ValueError, match="needs the tools"):
        tool_sft_text(search_row, use_tool=False)


def test_result_block_is_what_the_agent_loop_appends():
    from verl.workers.rollout.tool_rounds import RESULT_TEMPLATE

    assert result_block("42") == RESULT_TEMPLATE.format("42")


def test_search_questions_are_answered_by_the_corpus_only():
    world = make_world(12, seed=3)
    assert world == make_world(12, seed=3)
    assert len({w["country"] for w in world} | {w["capital"] for w in world}) == 24  # all names distinct
    corpus = make_search_corpus(world)
    assert all(set(row) == {"id", "title", "text"} for row in corpus) and len({r["id"] for r in corpus}) == 24
    texts = {row["text"] for row in corpus}
    rows = make_deep_search_rows(world, "all")
    assert len(rows) == 24
    for entry in world:
        assert f"The capital of {entry['country']} is {entry['capital']}." in texts
        assert f"{entry['capital']} has a population of {entry['population']} people." in texts
    truths = {row["extra_info"]["question"]: row["reward_model"]["ground_truth"] for row in rows}
    for entry in world:
        assert truths[f"What is the capital of {entry['country']}?"] == entry["capital"]
        assert truths[f"What is 3 times the population of {entry['capital']}?"] == str(3 * entry["population"])


def test_search_splits_are_disjoint_and_cover_all_questions():
    world = make_world(24)
    train, test = make_deep_search_rows(world, "train"), make_deep_search_rows(world, "test")
    questions = [r["extra_info"]["question"] for r in train + test]
    assert len(questions) == len(set(questions)) == 48 and test


def test_every_demonstration_passes_the_gate_and_scores_full_marks(files):
    rows = pd.concat([pd.read_parquet(files["train.parquet"]), pd.read_parquet(files["test.parquet"])])
    assert set(rows["data_source"]) == {ARITHMETIC_SOURCE, SEARCH_SOURCE}
    bonus = 0
    for _, row in rows.iterrows():
        info, truth = row["extra_info"], row["reward_model"]["ground_truth"]
        assert validate_format(info["response"]) == (True, "ok")
        score = default_compute_score(row["data_source"], info["response"], truth)
        both_tools = "</search>" in info["response"] and "</python>" in info["response"]
        bonus += both_tools
        assert score["score"] == pytest.approx(1.1 if both_tools else 1.0), info["response"]
        if info["direct"]:
            assert default_compute_score(row["data_source"], info["direct"], truth)["score"] == 1.0
    assert bonus > 0  # the multi-tool questions are there


def test_python_demonstrations_show_what_the_tool_prints(files):
    from verl.workers.tools.python_tool import PythonTool

    tool = PythonTool(timeout_s=10)
    responses = pd.read_parquet(files["train.parquet"])["extra_info"].map(lambda info: info["response"])
    calls = [r for r in responses if "<python>" in r]
    for arithmetic in (True, False):  # one of each task
        response = next(r for r in calls if ("<search>" in r) != arithmetic)
        code = response.split("<python>")[1].split("</python>")[0]
        assert f"<python>{code}</python>" + result_block(tool.execute(code)) in response


def test_search_demonstrations_show_what_the_tool_returns(files):
    tool = SearchTool(corpus_path=files["corpus.jsonl"], max_results=2)
    rows = pd.read_parquet(files["train.parquet"])
    for info in rows[rows["data_source"] == SEARCH_SOURCE]["extra_info"]:
        query = info["response"].split("<search>")[1].split("</search>")[0]
        assert f"<search>{query}</search>" + result_block(tool.execute(query)) in info["response"]


def test_files_load_and_are_deterministic(files, tmp_path):
    again = write_tool_task_files(str(tmp_path), arithmetic_train=64, arithmetic_test=16, n_countries=12)
    for name in ("train.parquet", "test.parquet", "sft_train.parquet"):
        assert pd.read_parquet(files[name]).equals(pd.read_parquet(again[name]))
    with open(files["corpus.jsonl"]) as f:
        corpus = [json.loads(line) for line in f]
    assert corpus == make_search_corpus(make_world(12))
    train, test = pd.read_parquet(files["train.parquet"]), pd.read_parquet(files["test.parquet"])
    assert list(train.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(train) == 64 + 24 - (len(test) - 16)  # 64 + 16 arithmetic rows, the 24 search questions split
    assert list(train["extra_info"].map(lambda info: info["index"])) == list(range(len(train)))
    assert not set(train["extra_info"].map(lambda i: i["question"])) & set(test["extra_info"].map(lambda i: i["question"]))


def test_sft_file_mixes_tool_and_direct_answers(files, tmp_path):
    sft = pd.read_parquet(files["sft_train.parquet"])
    assert list(sft.columns) == ["prompt", "response"] and len(sft) == len(pd.read_parquet(files["train.parquet"]))
    arithmetic = sft[sft["response"].str.contains("Answer now") | sft["response"].str.contains("print(", regex=False)]
    arithmetic = arithmetic[~arithmetic["response"].str.contains("<search>", regex=False)]
    assert len(arithmetic) == 64
    assert 0.3 < arithmetic["response"].str.contains("<python>", regex=False).mean() < 0.7
    all_tool = write_tool_task_files(str(tmp_path), arithmetic_train=16, arithmetic_test=4, n_countries=2,
                                     sft_tool_fraction=1.0)
    assert not pd.read_parquet(all_tool["sft_train.parquet"])["response"].str.contains("Answer now").any()


def test_prompts_fit_the_tiny_model(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # the longest questions: 6-digit factors, and many made-up names
    rows = make_tool_arithmetic_rows(50, "all", digits=(6, 6)) + make_deep_search_rows(make_world(200), "all")
    texts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True) for row in rows]
    tokens = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    assert 100 < max(tokens) < MAX_PROMPT_TOKENS
