"""verl/workers/rollout/generation.py: one protocol for the three ways of generating, chosen in one place, each giving
n responses per prompt, adjacent, in the rollout batch layout with the data's columns."""

import pytest
import torch
from omegaconf import OmegaConf
from scripted_engine import EOS, TOK, ScriptedEngine

from verl.protocol import DataProto
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.generation import AgentLoops, PlainSampling, ToolRounds, build_generator
from verl.workers.rollout.modes import generation_mode

ROLLOUT = {"response_length": 16, "prompt_length": 8, "seed": 0, "mode": "sync", "name": "hf",
           "agent": {"num_workers": 1, "default_agent_loop": "single_turn_agent", "agent_loop_config_path": None},
           "multi_turn": {"enable": False, "format": None, "max_assistant_turns": None, "max_user_turns": None,
                          "max_parallel_calls": 1, "max_tool_response_length": None,
                          "tool_response_truncate_side": "middle", "tool_config_path": None,
                          "function_tool_path": None},
           "tools": {"tool_instances": {}, "timeout": 5}, "initial_rollouts": None, "beam_size": 1,
           "branch_probability": 0.5, "entropy_weight": 0.5, "branch_rule": "arpo", "branch_penalty": 0.05,
           "entropy_mode": "topk", "entropy_window": 8, "entropy_top_k": 2, "enable_dynamic_rollouts": False,
           "initial_entropy_tokens": 4, "dynamic_rollout_beta": 0.5}


def config(**rollout):
    return OmegaConf.create({"rollout": {**ROLLOUT, **rollout}})


def prompts(texts):
    ids = [TOK.encode(t + "|") for t in texts]
    width = max(map(len, ids))
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    return DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[EOS] * (width - len(r)) + r for r in ids]), "attention_mask": mask,
                 "position_ids": torch.clip(mask.cumsum(-1) - 1, min=0)},
        non_tensors={"raw_prompt_ids": ids, "data_source": [f"set-{t}" for t in texts]})


@pytest.mark.parametrize("mode, cls", [("plain", PlainSampling), ("tool_rounds", ToolRounds),
                                       ("agent_loops", AgentLoops)])
def test_every_way_gives_n_responses_per_prompt_adjacent_with_the_datas_columns(mode, cls):
    engine = ScriptedEngine(lambda prompt, response: f"answer {prompt}$")
    generator = build_generator(engine, TOK, config(), rank=0, mode=mode)
    assert isinstance(generator, cls)
    out = generator.generate(prompts(["a", "bb"]), SamplingParams(max_tokens=16), n=3, validate=True)
    responses = [TOK.decode(ids[m.bool()].tolist()) for ids, m in zip(out.batch["responses"],
                                                                        out.batch["response_mask"])]
    assert responses == ["answer a"] * 3 + ["answer bb"] * 3
    assert list(out.non_tensor_batch["data_source"]) == ["set-a"] * 3 + ["set-bb"] * 3
    assert out.batch["input_ids"].shape == (6, out.batch["prompts"].shape[1] + 16)
    generator.close()


def test_the_mode_is_decided_once_from_the_rollout_config():
    assert generation_mode(config().rollout) == "plain"
    assert generation_mode(config(mode="sync_with_tool").rollout) == "tool_rounds"
    assert generation_mode(config(mode="async").rollout) == "agent_loops"
    with pytest.raises(ValueError, match="generation mode 'beam' is not one of plain, tool_rounds, agent_loops"):
        build_generator(ScriptedEngine(lambda p, r: "$"), TOK, config(), rank=0, mode="beam")
