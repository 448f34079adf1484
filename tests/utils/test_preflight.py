"""The input checks main_ppo runs before Ray starts: model directories, the tokenizer, writable output directories."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from verl.utils.config import ConfigError
from verl.utils.preflight import check_model_dir, check_writable_dir, json_error, load_tokenizer


def test_a_model_directory_needs_a_config_json_that_parses(tiny_model_dir, tmp_path):
    check_model_dir(tiny_model_dir, "actor_rollout_ref.model.path")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=rf"^critic.model.path={tmp_path}/empty is empty: it is not a Hugging Face"):
        check_model_dir(str(tmp_path / "empty"), "critic.model.path")
    (tmp_path / "weights_only").mkdir()
    (tmp_path / "weights_only" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"weights_only holds model.safetensors but no config.json"):
        check_model_dir(str(tmp_path / "weights_only"), "k")
    shutil.copytree(tiny_model_dir, tmp_path / "cut")
    (tmp_path / "cut" / "config.json").write_text('{\n  "architectures": [\n    "Qwen2')
    with pytest.raises(ConfigError) as error:
        check_model_dir(str(tmp_path / "cut"), "actor_rollout_ref.model.path")
    assert str(error.value).startswith(
        f"{tmp_path}/cut/config.json is not valid JSON (Unterminated string starting "
        "at line 3, column 5), so the model of actor_rollout_ref.model.path cannot be "
        "read"
    )


def test_the_tokenizer_loads_and_has_a_chat_template(tiny_model_dir, tmp_path):
    assert load_tokenizer(tiny_model_dir, "actor_rollout_ref.model.path").chat_template
    shutil.copytree(tiny_model_dir, tmp_path / "plain")
    os.remove(tmp_path / "plain" / "chat_template.jinja")
    with pytest.raises(
        ConfigError,
        match=rf"the tokenizer at {tmp_path}/plain \(actor_rollout_ref.model.path\) has "
        "no chat template",
    ):
        load_tokenizer(str(tmp_path / "plain"), "actor_rollout_ref.model.path")
    (tmp_path / "no_tokenizer").mkdir()
    shutil.copy(os.path.join(tiny_model_dir, "config.json"), tmp_path / "no_tokenizer")
    with pytest.raises(ConfigError) as error:
        load_tokenizer(str(tmp_path / "no_tokenizer"), "actor_rollout_ref.model.tokenizer_path")
    assert str(error.value).startswith(
        f"actor_rollout_ref.model.tokenizer_path={tmp_path}/no_tokenizer holds no "
        "tokenizer (none of tokenizer.json, tokenizer_config.json, tokenizer.model, "
        "vocab.json); save the model's tokenizer into it"
    )
    (tmp_path / "no_tokenizer" / "tokenizer.json").write_text("{")
    with pytest.raises(ConfigError, match=r"no_tokenizer: the tokenizer cannot be loaded \(\w+: .*\); save"):
        load_tokenizer(str(tmp_path / "no_tokenizer"), "actor_rollout_ref.model.tokenizer_path")


def test_an_output_directory_must_be_writable_and_nothing_is_created(tmp_path):
    check_writable_dir(str(tmp_path / "a" / "b"), "trainer.rollout_data_dir")
    assert os.listdir(tmp_path) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(
        ConfigError,
        match=rf"trainer.rollout_data_dir={tmp_path}/file/dumps: {tmp_path}/file is a "
        "file, not a directory",
    ):
        check_writable_dir(str(tmp_path / "file" / "dumps"), "trainer.rollout_data_dir")


def test_json_error_says_where():
    with pytest.raises(json.JSONDecodeError) as error:
        json.loads('{"a": 1,\n "b": }')
    assert json_error(error.value) == "Expecting value at line 2, column 7"
    assert json_error(error.value, with_line=False) == "Expecting value at column 7"


def test_a_generative_reward_model_is_refused_with_the_judge_path_named(tiny_model_dir, tmp_path):
    """reward_model.model.path at a causal LM without reward_model.rollout.name (the reward-model workers would score
    it with a new head): an error that names the architecture and how to serve it instead; a classifier passes."""
    from verl.utils.preflight import check_scoring_head

    with pytest.raises(ConfigError, match=r"reward_model.model.path=.* is a generative model \(Qwen2ForCausalLM\).*"
                                          r"reward_model.rollout.name=vllm.*judge_reward.py"):
        check_scoring_head(tiny_model_dir)
    classifier = tmp_path / "rm"
    classifier.mkdir()
    (classifier / "config.json").write_text('{"architectures": ["Qwen2ForSequenceClassification"]}')
    check_scoring_head(str(classifier))


def test_the_judge_reward_grades_with_the_served_model(tmp_path):
    """verl/utils/reward_score/judge_reward.py: the served judge decides where the rule check does not; the
    question comes from extra_info; replies are cached in cache_path."""
    from openai_stub import OpenAIStub

    from verl.utils.reward_score import judge_reward

    def reply(messages):
        prompt = messages[-1]["content"]
        return "Correct" if "Answer to check: forty-two" in prompt else "Incorrect"

    with OpenAIStub(reply=reply) as stub:
        kwargs = {"base_url": stub.url, "model": stub.model, "cache_path": str(tmp_path / "judge.json")}
        info = {"question": "What is six times seven?"}
        right = judge_reward.compute_score("qa", "<answer>\\boxed{forty-two}</answer>", "42", info, **kwargs)
        wrong = judge_reward.compute_score("qa", "<answer>\\boxed{41}</answer>", ["42"], info, **kwargs)
        by_rule = judge_reward.compute_score("qa", "<answer>\\boxed{42}</answer>", "42", info, **kwargs)
        assert (right["score"], wrong["score"], by_rule["score"]) == (1.0, 0.0, 1.0)
        assert (right["judge_status"], by_rule["judge_status"]) == ("judge_correct", "rule_equal")
        asked = len(stub.chat_requests)
        assert asked == 2 and "What is six times seven?" in stub.chat_requests[0]["messages"][-1]["content"]
        judge_reward.compute_score("qa", "<answer>\\boxed{forty-two}</answer>", "42", info, **kwargs)
        assert len(stub.chat_requests) == asked  # from the cache
