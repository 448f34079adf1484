"""Splicing the reference answer into responses, and the y* token mask, on hand-written responses."""

from __future__ import annotations

import pytest

from verl.workers.reward_manager.rlpr.splice import build_pr_batch, is_valid, splice_reference, tokenize_spliced

EOS = "<|im_end|>"


@pytest.mark.parametrize(("response", "r1", "nothink"), [
    ("<think>r</think> mid <answer> 42 </answer>", True, True),
    ("<think>r</think><answer> 42", True, True),  # truncated: </answer> is not needed
    ("<think>r</think><answer>   ", False, False),  # nothing after <answer>
    ("<think>r</think><answer>1</answer><answer>2</answer>", False, False),
    ("<answer>42</answer>", False, True),  # no think: R1 only
    ("<answer>42</answer><think>r</think>", False, True),  # think after the answer
    ("<think>a</think><think>b</think><answer>4</answer>", False, True),
    ("just text", False, False),
])
def test_validity(response, r1, nothink):
    assert is_valid(response, "R1") is r1 and is_valid(response, "R1_nothink") is nothink


def test_splice_keeps_the_reasoning_and_the_models_leading_whitespace():
    spliced = splice_reference("P:", "<think>r</think> mid <answer>\n 42 </answer>", "7", EOS)
    assert spliced.text == f"P:<think>r</think> mid <answer>\n 7 </answer>{EOS}"
    assert spliced.text[slice(*spliced.answer_span)] == "7"
    assert spliced.text[spliced.response_start :].startswith("<answer>") and spliced.valid
    bare = splice_reference("P:", "<think>r</think><answer>42", "7", EOS)  # no whitespace written: one space
    assert bare.text == f"P:<think>r</think><answer> 7 </answer>{EOS}"
    nothink = splice_reference("P:", "so <answer>42</answer>", "7", EOS, mode="R1_nothink")
    assert nothink.text == f"P:so <answer> 7 </answer>{EOS}"


def test_invalid_responses_get_an_unscored_stand_in(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    spliced = splice_reference("P:", "no answer here", "7", EOS)
    assert not spliced.valid and spliced.text == f"P:<answer> 7 </answer>{EOS}"
    row = tokenize_spliced(spliced, tokenizer, 64, 64)
    assert not row["valid"] and sum(row["answer_mask"]) == 0 and row["response_ids"]


def test_answer_tokens_include_a_token_straddling_the_boundary(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    spliced = splice_reference("Q?", "<think>hmm</think><answer> Paris</answer>", "answer sum", EOS)
    row = tokenize_spliced(spliced, tokenizer, 64, 64)
    masked = [t for t, m in zip(row["response_ids"], row["answer_mask"]) if m]
    # Qwen's pre-tokenizer glues the space before a word to it: " answer" is one token, scored, space included.
    assert [tokenizer.decode([t]) for t in masked] == [" answer", " sum"]
    assert tokenizer.decode(row["response_ids"]).startswith("<answer>")
    assert tokenizer.decode(row["prompt_ids"]) == "Q?<think>hmm</think>"
    assert tokenizer.decode(row["prompt_ids"] + row["response_ids"]) == spliced.text


def test_rows_too_long_for_the_limits_are_invalid_row_by_row(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    short = tokenize_spliced(splice_reference("Q", "<think>a</think><answer>1", "2", EOS), tokenizer, 16, 16)
    long = tokenize_spliced(splice_reference("Q", "<think>" + "word " * 40 + "</think><answer>1", "2", EOS),
                            tokenizer, 16, 16)
    assert short["valid"] and sum(short["answer_mask"]) == 1
    assert not long["valid"] and sum(long["answer_mask"]) == 0
    batch = build_pr_batch([short, long], tokenizer.pad_token_id, 16, 16)
    assert batch["input_ids"].shape == (2, 32) and batch["responses"].shape == (2, 16)
    assert batch["answer_mask"].sum(-1).tolist() == [1, 0]
    first = batch["attention_mask"][0]
    assert first[:16].sum() == len(short["prompt_ids"]) and first[16:].sum() == len(short["response_ids"])
    assert batch["position_ids"][0, 16].item() == len(short["prompt_ids"])  # positions run on into the response


def test_official_splicing_options(tiny_model_dir):
    from transformers import AutoTokenizer

    tight = splice_reference("P:", "<think>r</think><answer>42\n</answer>", "7", EOS,
                             allow_empty_leading_whitespaces=True, gt_tokens_one_more=True)
    assert tight.text == f"P:<think>r</think><answer>7\n</answer>{EOS}"  # lw empty as written, tw the model's
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    spliced = splice_reference("Q", "<think>a</think><answer> 1 </answer>", "answer", EOS, gt_tokens_one_more=True)
    row = tokenize_spliced(spliced, tokenizer, 32, 32, one_more=True)
    marked = {m: [tokenizer.decode([t]) for t, mm in zip(row["response_ids"], row["answer_mask"]) if mm == m]
              for m in (1, 2)}
    assert marked[1] == [" answer"] and len(marked[2]) == 1  # the token right after y* is scored too
