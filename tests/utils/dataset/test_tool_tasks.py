"""The synthetic tool tasks: schema, splits, ground truths, and demonstrations that the reward and the tools agree with."""

from __future__ import annotations

import pandas as pd
import pytest

from verl.utils.dataset.tool_tasks import (
    ARITHMETIC_SOURCE,
    SEARCH_SOURCE,
    make_deep_search_rows,
    make_search_corpus,
    make_tool_arithmetic_rows,
    make_world,
    write_tool_task_files,
)
from verl.utils.reward_score import default_compute_score
from verl.workers.tools.search_tool import SearchTool


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_tool_task_files(str(tmp_path_factory.mktemp("tool_tasks")), arithmetic_train=64,
                                 arithmetic_test=16, n_countries=12)


def test_arithmetic_rows_are_deterministic_disjoint_and_right():
    train, test = make_tool_arithmetic_rows(50, "train"), make_tool_arithmetic_rows(20, "test")
    assert train == make_tool_arithmetic_rows(50, "train")
    questions = {r["extra_info"]["question"] for r in train}
    assert not questions & {r["extra_info"]["question"] for r in test}
    for row in train:
        a, b = (int(x) for x in row["extra_info"]["question"][len("What is "):-1].split(" * "))
        assert row["reward_model"]["ground_truth"] == str(a * b)
        assert f"<python>print({a} * {b})</python>" in row["extra_info"]["response"]


def test_search_questions_are_answered_by_the_corpus_only():
    world = make_world(12, seed=3)
    assert len({w["country"] for w in world} | {w["capital"] for w in world}) == 24  # all names distinct
    corpus_text = " ".join(row["text"] for row in make_search_corpus(world))
    rows = make_deep_search_rows(world, "all")
    assert len(rows) == 24
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        assert truth in corpus_text or str(int(truth) // 3) in corpus_text


def test_every_demonstration_passes_the_reward(files):
    rows = pd.concat([pd.read_parquet(files["train.parquet"]), pd.read_parquet(files["test.parquet"])])
    assert set(rows["data_source"]) == {ARITHMETIC_SOURCE, SEARCH_SOURCE}
    for _, row in rows.iterrows():
        info, truth = row["extra_info"], row["reward_model"]["ground_truth"]
        score = default_compute_score(row["data_source"], info["response"], truth)
        both_tools = "</search>" in info["response"] and "</python>" in info["response"]
        assert score["score"] == pytest.approx(1.1 if both_tools else 1.0), info["response"]
        if info["direct"]:
            assert default_compute_score(row["data_source"], info["direct"], truth)["score"] == 1.0


def test_search_demonstrations_show_what_the_tool_returns(files):
    tool = SearchTool(corpus_path=files["corpus.jsonl"], max_results=2)
    rows = pd.read_parquet(files["train.parquet"])
    for info in rows[rows["data_source"] == SEARCH_SOURCE]["extra_info"]:
        query = info["response"].split("<search>")[1].split("</search>")[0]
        assert f" <result>\n{tool.execute(query)}\n</result>" in info["response"]


def test_sft_file_mixes_tool_and_direct_answers(files):
    sft = pd.read_parquet(files["sft_train.parquet"])
    assert list(sft.columns) == ["prompt", "response"] and len(sft) == len(pd.read_parquet(files["train.parquet"]))
    arithmetic = sft[sft["response"].str.contains("Answer now") | sft["response"].str.contains("print(", regex=False)]
    uses_tool = arithmetic["response"].str.contains("<python>", regex=False).mean()
    assert 0.3 < uses_tool < 0.7


def test_prompts_fit_the_tiny_model(tiny_model_dir, files):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = pd.read_parquet(files["train.parquet"])
    tokens = [len(tokenizer(tokenizer.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)["input_ids"]) for p in rows["prompt"]]
    assert max(tokens) <= 160  # the agentic recipes' tiny data.max_prompt_length
