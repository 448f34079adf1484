"""Loading the reward function from config (verl/trainer/ppo/reward.py), including custom functions from files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo.reward import compute_reward, get_custom_reward_fn, load_reward_manager
from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager import NaiveRewardManager

CUSTOM_REWARD_SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str == ground_truth), "length": len(solution_str)}


def scaled_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return scale * float(solution_str == ground_truth)
"""


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))


def one_row_batch(response: str, ground_truth: str, data_source: str = "arithmetic") -> DataProto:
    """Prompt "q" (length 1) and `response` padded to 8 tokens with id 0."""
    response_ids = torch.zeros(1, 8, dtype=torch.long)
    response_ids[0, : len(response)] = torch.tensor([ord(c) for c in response])
    attention_mask = torch.zeros(1, 9, dtype=torch.long)
    attention_mask[0, : 1 + len(response)] = 1
    return DataProto.from_dict(
        tensors={"prompts": torch.tensor([[ord("q")]]), "responses": response_ids, "attention_mask": attention_mask},
        non_tensors={
            "data_source": np.array([data_source], dtype=object),
            "reward_model": np.array([{"ground_truth": ground_truth}], dtype=object),
        },
    )


@pytest.fixture
def custom_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM_REWARD_SOURCE)
    return str(path)


def make_config(path=None, name=None, reward_kwargs=None, reward_manager="naive"):
    return OmegaConf.create(
        {
            "custom_reward_function": {"path": path, "name": name, "reward_kwargs": reward_kwargs or {}},
            "reward_model": {"reward_manager": reward_manager},
            "data": {"reward_fn_key": "data_source"},
        }
    )


def test_no_custom_path_means_none():
    assert get_custom_reward_fn(make_config()) is None
    assert get_custom_reward_fn({}) is None


def test_custom_function_loaded_by_name_with_kwargs(custom_file):
    default_named = get_custom_reward_fn(make_config(custom_file))
    assert default_named(None, "a", "a") == {"score": 1.0, "length": 1}
    scaled = get_custom_reward_fn(make_config(custom_file, "scaled_score", {"scale": 3.0}))
    assert scaled(data_source=None, solution_str="a", ground_truth="a") == 3.0


def test_custom_function_errors_name_the_config(custom_file, tmp_path):
    missing = str(tmp_path / "absent.py")
    with pytest.raises(FileNotFoundError, match=r"custom_reward_function\.path=.*absent\.py"):
        get_custom_reward_fn(make_config(missing))
    with pytest.raises(AttributeError, match=r"'nope'.*my_reward\.py"):
        get_custom_reward_fn(make_config(custom_file, "nope"))


def test_load_reward_manager_uses_default_compute_score():
    manager = load_reward_manager(make_config(), CharTokenizer(), num_examine=0)
    assert isinstance(manager, NaiveRewardManager)
    assert manager.compute_score.func is default_compute_score
    reward_tensor, extra = compute_reward(one_row_batch("#### 7", "7"), manager)
    assert reward_tensor[0, 5] == 1.0 and reward_tensor.sum() == 1.0
    assert extra == {"reward_status": ["ok"]}


def test_code_test_subsampling_only_outside_evaluation():
    from omegaconf import OmegaConf

    config = OmegaConf.create({"reward_model": {"code_execution": {
        "per_test_timeout_s": 2.0, "total_timeout_s": 9.0, "memory_mb": 512, "max_train_tests": 4}}})
    train = load_reward_manager(config, CharTokenizer(), num_examine=0).compute_score
    evaluation = load_reward_manager(config, CharTokenizer(), num_examine=0, is_eval=True).compute_score
    limits = {"per_test_timeout_s": 2.0, "total_timeout_s": 9.0, "memory_mb": 512}
    assert train.keywords == {**limits, "max_tests": 4}
    assert evaluation.keywords == {**limits, "max_tests": None}


def test_load_reward_manager_with_custom_function(custom_file):
    manager = load_reward_manager(make_config(custom_file), CharTokenizer(), num_examine=0)
    reward_tensor, extra = compute_reward(one_row_batch("abc", "abc", data_source="anything"), manager)
    assert reward_tensor[0, 2] == 1.0
    assert extra == {"length": [3], "reward_status": ["ok"]}


def test_load_reward_manager_unknown_manager():
    with pytest.raises(ValueError, match=r"reward_model\.reward_manager='batchy'"):
        load_reward_manager(make_config(reward_manager="batchy"), CharTokenizer(), num_examine=0)


def test_compute_reward_accepts_a_plain_tensor_result():
    tensor = torch.ones(1, 2)
    assert compute_reward(None, lambda data, return_dict: tensor) == (tensor, {})


def test_a_verl_manager_with_verls_constructor_gets_only_the_keywords_it_takes():
    """A reward manager copied from verl takes (tokenizer, num_examine, compute_score, reward_fn_key) and no
    **kwargs: Quiver's own settings (max_resp_len, overlong_buffer_cfg, timeout_s) are not forced on it; what
    reward_model.reward_kwargs names still is."""
    from verl.workers.reward_manager import register
    from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY

    @register("verl_style_test")
    class VerlStyle:
        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", scale=1.0):
            self.compute_score, self.reward_fn_key, self.scale = compute_score, reward_fn_key, scale

    def config(reward_kwargs):
        return OmegaConf.create({"reward_model": {"reward_manager": "verl_style_test", "reward_kwargs": reward_kwargs},
                                 "data": {"reward_fn_key": "data_source", "max_response_length": 8}})

    try:
        manager = load_reward_manager(config({"scale": 2.0}), CharTokenizer(), num_examine=0)
        assert isinstance(manager, VerlStyle) and manager.scale == 2.0 and manager.reward_fn_key == "data_source"
        with pytest.raises(TypeError, match="unexpected keyword argument 'typo'"):  # the user's own keys still go
            load_reward_manager(config({"typo": 1}), CharTokenizer(), num_examine=0)
    finally:
        REWARD_MANAGER_REGISTRY.pop("verl_style_test")


def test_a_manager_declares_the_reward_model_keys_it_takes():
    from verl.workers.reward_manager import ProbRewardManager

    config = OmegaConf.create({
        "reward_model": {"reward_manager": "prob", "format_mode": "R1_nothink",
                         "compute_score_name": "mean_log_softmax", "use_debiasing": True,
                         "compute_scoreA_online": True, "format_coefficient": None,
                         "overlong_buffer": {"enable": False}},
        "data": {"reward_fn_key": "data_source", "max_prompt_length": 7, "max_response_length": 9}})
    manager = load_reward_manager(config, CharTokenizer(), num_examine=0)
    assert isinstance(manager, ProbRewardManager)
    assert (manager.format_mode, manager.aggregation) == ("R1_nothink", "mean_log_softmax")
    assert manager.use_debiasing and manager.compute_score_a_online
    assert (manager.max_prompt_length, manager.max_response_length) == (7, 9)
    assert manager.format_coefficient == 0.1  # a null key keeps the constructor's default
    assert NaiveRewardManager.config_kwargs(config) == {}  # the naive manager takes none of them

    class WithOption(NaiveRewardManager):
        reward_model_keys = ("my_option", "format_mode")

    assert WithOption.config_kwargs(OmegaConf.create({"reward_model": {"my_option": 3}})) == {"my_option": 3}


def test_a_served_reward_model_reaches_the_reward_function_as_reward_router_address(tmp_path):
    from verl.utils.model_server import Server

    fn = tmp_path / "genrm.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, "
                  "reward_router_address=None, **kwargs):\n    return float(reward_router_address == '127.0.0.1:9')\n")
    config = OmegaConf.create({"custom_reward_function": {"path": str(fn)},
                               "reward_model": {"enable": True, "rollout": {"name": "vllm"}}})
    manager = load_reward_manager(config, tokenizer=None, num_examine=0,
                                  reward_server=Server("http://127.0.0.1:9/v1", "genrm", "log"))
    assert manager.compute_score("d", "s", "g") == 1.0
    assert not manager.rm_score_in_extra_info  # no reward-model workers put scores in the batch


@pytest.mark.vllm
def test_a_served_reward_model_needs_a_generative_model_and_a_function_that_calls_it(tiny_model_dir, tmp_path):
    from verl.trainer.config import load_config
    from verl.trainer.ppo.reward import check_served_reward_model
    from verl.utils.config import ConfigError

    served = ["reward_model.enable=true", f"reward_model.model.path={tiny_model_dir}", "reward_model.rollout.name=vllm"]
    judge = "custom_reward_function.path=verl/utils/reward_score/judge_reward.py"
    check_served_reward_model(load_config(overrides=[*served, judge]))  # a causal LM, a function taking the address
    with pytest.raises(ConfigError, match="custom_reward_function.path is not set: point it at a function"):
        check_served_reward_model(load_config(overrides=served))
    plain = tmp_path / "plain.py"
    plain.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    with pytest.raises(ConfigError, match="takes no reward_router_address"):
        check_served_reward_model(load_config(overrides=[*served, f"custom_reward_function.path={plain}"]))
    classifier = tmp_path / "rm"
    classifier.mkdir()
    (classifier / "config.json").write_text('{"architectures": ["Qwen2ForSequenceClassification"]}')
    with pytest.raises(ConfigError, match="is a classifier.*reward_model.rollout.name=null"):
        check_served_reward_model(load_config(overrides=[*served[:1], f"reward_model.model.path={classifier}",
                                                         served[2], judge]))
