"""The tiny model builder: deterministic, reloadable offline, ChatML template, generation works."""

from __future__ import annotations

import os
import runpy
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.demo.tiny_model import build_tiny_model, build_tokenizer

MESSAGES = [{"role": "user", "content": "What is 17 + 5? Put the final answer after ####."}]


def _read_all(directory: str) -> dict[str, bytes]:
    files = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            files[name] = f.read()
    return files


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_same_seed_gives_identical_files_and_other_seed_other_weights(tmp_path, tiny_model_dir):
    build_tiny_model(str(tmp_path / "again"), seed=0)
    build_tiny_model(str(tmp_path / "seed1"), seed=1)
    first, again, seed1 = (
        _read_all(tiny_model_dir),
        _read_all(str(tmp_path / "again")),
        _read_all(str(tmp_path / "seed1")),
    )
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= set(first)
    assert first == again
    assert seed1["tokenizer.json"] == first["tokenizer.json"]
    assert seed1["model.safetensors"] != first["model.safetensors"]


def test_build_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(str(tmp_path / "m"))
    assert torch.equal(torch.rand(3), expected)


def test_reloads_offline_with_expected_ids(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [0, 1, 2]
    assert tokenizer.pad_token_id == 0 and tokenizer.eos_token_id == 2
    assert 512 <= len(tokenizer) <= 1024
    config = model.config
    assert config.model_type == "qwen2" and config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (0, 2, 0)
    assert model.generation_config.eos_token_id == 2 and model.generation_config.pad_token_id == 0
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_reloaded_tokenizer_matches_trained_one(tokenizer):
    text = "Hello  world!! 12345 x=3.14\n\n  def f(a):\n\treturn a  # don't stop ü 你好 Café\r\n e\u0301 ####42"
    assert tokenizer.encode(text, add_special_tokens=False) == build_tokenizer().encode(text, add_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert (
        tokenizer.decode(ids)
        == "Hello  world!! 12345 x=3.14\n\n  def f(a):\n\treturn a  # don't stop ü 你好 Café\r\n é ####42"
    )
    digits = tokenizer.convert_ids_to_tokens(tokenizer.encode("12345", add_special_tokens=False))
    assert digits == ["1", "2", "3", "4", "5"]  # one token per digit, as in Qwen


def test_chat_template(tokenizer):
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>user\nWhat is 17 + 5? Put the final answer after ####.<|im_end|>\n<|im_start|>assistant\n"
    )
    conversation = [{"role": "system", "content": "Be brief."}, *MESSAGES, {"role": "assistant", "content": "22"}]
    text = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 17 + 5? Put the final answer after ####.<|im_end|>\n"
        "<|im_start|>assistant\n22<|im_end|>\n"
    )
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(2) == 1  # special tokens are single ids, never split
    assert tokenizer.decode(ids, skip_special_tokens=True) == (
        "user\nWhat is 17 + 5? Put the final answer after ####.\nassistant\n"
    )


GSM8K_TOOL = {"type": "function", "function": {
    "name": "calc_gsm8k_reward", "description": "A tool for calculating the reward of gsm8k",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string", "description": "The answer"}},
                   "required": ["answer"]}}}


def test_chat_template_renders_tools_as_qwen2_5_instruct(tokenizer):
    """The schemas in the system turn, calls as <tool_call> blocks, tool results in one user turn of
    <tool_response> blocks: Qwen2.5-Instruct's rendering, written out by hand here."""
    prompt = tokenizer.apply_chat_template(MESSAGES, tools=[GSM8K_TOOL], add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "calc_gsm8k_reward", "description": "A tool for calculating the '
        'reward of gsm8k", "parameters": {"type": "object", "properties": {"answer": {"type": "string", '
        '"description": "The answer"}}, "required": ["answer"]}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call>"
        ' XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is 17 + 5? Put the final answer after ####.<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, *MESSAGES],
                                                tools=[GSM8K_TOOL], add_generation_prompt=True, tokenize=False)
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert with_system.count("<|im_start|>system") == 1
    conversation = [
        *MESSAGES,
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"type": "function", "function": {"name": "calc_gsm8k_reward", "arguments": {"answer": "22"}}},
            {"type": "function", "function": {"name": "calc_gsm8k_reward", "arguments": '{"answer": "23"}'}}]},
        {"role": "tool", "content": "reward=1.0"},
        {"role": "tool", "content": "reward=0.0"},
        {"role": "assistant", "content": "#### 22"},
    ]
    text = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert text == (
        "<|im_start|>user\nWhat is 17 + 5? Put the final answer after ####.<|im_end|>\n"
        "<|im_start|>assistant\nLet me check.\n"
        '<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "22"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "23"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nreward=1.0\n</tool_response>\n<tool_response>\nreward=0.0\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n#### 22<|im_end|>\n"
    )


def test_generation_runs(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    input_ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    out = model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=8, do_sample=False, min_new_tokens=8
    )
    assert out.shape == (1, input_ids.shape[1] + 8)
    assert torch.equal(out[0, : input_ids.shape[1]], input_ids[0])
    assert isinstance(tokenizer.decode(out[0, input_ids.shape[1] :]), str)


def test_padded_vocab_and_too_small_vocab(tmp_path):
    path = build_tiny_model(str(tmp_path / "padded"), vocab_size=1024)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.get_input_embeddings().weight.shape == (1024, 64)
    with pytest.raises(ValueError, match="vocab_size=10 is smaller"):
        build_tiny_model(str(tmp_path / "small"), vocab_size=10)


def test_cli(tmp_path, monkeypatch):
    script = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "make_tiny_model.py")
    out = tmp_path / "cli"
    monkeypatch.setattr(
        sys, "argv", ["make_tiny_model.py", "--output_dir", str(out), "--hidden_size", "32", "--num_layers", "1"]
    )
    runpy.run_path(script, run_name="__main__")
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1


def test_reward_model_and_other_tokenizer(tmp_path, monkeypatch, tiny_model_dir):
    from transformers import AutoModelForSequenceClassification

    script = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "make_tiny_model.py")
    out = tmp_path / "rm"
    monkeypatch.setattr(sys, "argv", ["make_tiny_model.py", "--output_dir", str(out), "--reward_model",
                                      "--tokenizer_vocab_size", "512"])
    runpy.run_path(script, run_name="__main__")
    model = AutoModelForSequenceClassification.from_pretrained(str(out))
    assert model.config.num_labels == 1 and not os.path.exists(out / "generation_config.json")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert len(tokenizer) == 512 and tokenizer.get_vocab() != AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    with torch.no_grad():
        assert model(input_ids=torch.tensor([tokenizer.encode("2 + 3")])).logits.shape == (1, 1)
