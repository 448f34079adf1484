"""The "Extending Quiver" examples of README.md run as written, and what they register works where Quiver uses it.

Each example is the python block after a `<!-- example: NAME -->` line. Registered names are removed afterwards, so
the registries other tests see are unchanged.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.registry import ROLLOUT_REGISTRY

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLE = re.compile(r"<!-- example: (\w+) -->\n```python\n(.*?)```", re.DOTALL)
EXTENSION_POINTS = {"estimator", "policy_loss", "reward_manager", "scorer", "tool", "rollout_engine"}
REGISTRIES = (core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.POLICY_LOSS_REGISTRY, REWARD_MANAGER_REGISTRY,
              ROLLOUT_REGISTRY)
MODULE_PREFIX = "readme_example_"


def readme_examples() -> dict[str, str]:
    return dict(EXAMPLE.findall(README.read_text()))


@pytest.fixture
def run_example():
    """`run_example(name)` executes that README block as a module named readme_example_<name> and returns its
    namespace; on teardown every registry entry defined by such a module is removed."""
    examples = readme_examples()

    def run(name: str) -> dict:
        namespace = {"__name__": MODULE_PREFIX + name}
        exec(compile(examples[name], f"README.md <!-- example: {name} -->", "exec"), namespace)
        return namespace

    yield run
    for registry in REGISTRIES:
        for key in [k for k, v in registry.items() if getattr(v, "__module__", "").startswith(MODULE_PREFIX)]:
            del registry[key]


@pytest.fixture
def example_module(tmp_path, monkeypatch):
    """`example_module(name, module)` writes that README block to <tmp>/<module>.py, importable by its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def write(name: str, module: str) -> Path:
        path = tmp_path / f"{module}.py"
        path.write_text(readme_examples()[name])
        written.append(module)
        return path

    yield write
    for module in written:
        sys.modules.pop(module, None)


def test_readme_has_one_example_per_extension_point():
    assert set(readme_examples()) == EXTENSION_POINTS


def test_estimator_computes_advantages_through_the_trainer(run_example):
    from verl.trainer.ppo.ray_trainer import compute_advantage

    run_example("estimator")
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.float32)
    rewards = torch.zeros(4, 3)
    rewards[[0, 1, 2, 3], [1, 0, 2, 1]] = torch.tensor([1.0, 0.0, 0.5, 2.0])  # on each response's last token
    batch = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                                non_tensors={"uid": np.array(["a", "a", "a", "b"], dtype=object)})

    # The trainer fills the estimator's arguments from its signature (index = uid).
    out = compute_advantage(batch, "my_rloo", config=OmegaConf.create({"adv_estimator": "my_rloo"}))

    # Group a: s = (1, 0, 0.5), A_i = s_i - mean of the other two; group b has one sample: A = 0.
    expected = torch.tensor([0.75, -0.75, 0.0, 0.0])[:, None] * mask
    torch.testing.assert_close(out.batch["advantages"], expected)
    torch.testing.assert_close(out.batch["returns"], expected)


def test_policy_loss_returns_a_finite_scalar_and_its_metrics(run_example):
    run_example("policy_loss")
    loss_fn = core_algos.get_policy_loss_fn("my_cispo")
    config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0})
    ratios = torch.tensor([[0.5, 1.0, 1.5, 1.0]])
    log_prob = ratios.log().requires_grad_()
    old_log_prob = torch.zeros(1, 4)
    advantages = torch.ones(1, 4)
    mask = torch.ones(1, 4)

    # Called the way the actor calls it (dp_actor.update_policy).
    loss, metrics = loss_fn(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=mask,
                            loss_agg_mode="token-mean", config=config, entropy=None)

    assert loss.dim() == 0 and torch.isfinite(loss)
    weights = [0.8, 1.0, 1.28, 1.0]  # the ratio clipped to [1 - 0.2, 1 + 0.28]
    expected = -sum(w * math.log(r) for w, r in zip(weights, [0.5, 1.0, 1.5, 1.0])) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)  # float32
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -torch.tensor([weights]) / 4)
    assert metrics == {"actor/cispo_clipfrac": pytest.approx(0.5)}


class CharTokenizer:
    """Token i is the i-th character of VOCAB."""

    VOCAB = "# 0123456789"

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.VOCAB[int(i)] for i in ids)

    def encode(self, text: str) -> list[int]:
        return [self.VOCAB.index(c) for c in text]


def rollout_batch(responses: list[str], data_source: str, ground_truth: str, width: int = 8) -> DataProto:
    """A two-token prompt and a right-padded response per row, with the non-tensor columns of the RL dataset."""
    tok = CharTokenizer()
    ids = [tok.encode(text) for text in responses]
    padded = torch.tensor([row + [1] * (width - len(row)) for row in ids])
    response_mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    prompts = torch.full((len(ids), 2), 2)
    rows = len(ids)
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": padded,
                 "attention_mask": torch.cat([torch.ones(rows, 2, dtype=torch.long), response_mask], dim=1)},
        non_tensors={"data_source": np.array([data_source] * rows, dtype=object),
                     "reward_model": np.array([{"ground_truth": ground_truth}] * rows, dtype=object),
                     "extra_info": np.array([{}] * rows, dtype=object)})


def test_reward_manager_scores_a_batch_when_built_from_the_config(run_example):
    from verl.trainer.ppo.reward import load_reward_manager, run_reward

    run_example("reward_manager")
    config = OmegaConf.create({"reward_model": {"reward_manager": "brevity"}, "data": {"max_response_length": 8}})
    manager = load_reward_manager(config, CharTokenizer(), num_examine=0)
    batch = rollout_batch(["#### 7", "####3"], data_source="arithmetic", ground_truth="7")

    scores, extra_info, metrics = run_reward(batch, manager)

    expected = torch.zeros(2, 8)
    expected[0, 5] = 1.0 - 0.006  # right answer (arithmetic's rule), 6 tokens
    expected[1, 4] = 0.1 - 0.005  # well formed but wrong, 5 tokens
    torch.testing.assert_close(scores, expected)
    assert extra_info == {} and metrics == {}


def test_scorer_file_is_loaded_by_path_and_falls_back_to_the_builtin_rules(example_module):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    path = example_module("scorer", "my_reward")
    compute_score = get_custom_reward_fn({"custom_reward_function": {"path": str(path), "name": "compute_score"}})

    assert compute_score(data_source="my_task", solution_str="work\n 42 ", ground_truth="42", extra_info={}) == 1.0
    assert compute_score(data_source="my_task", solution_str="42\nmore", ground_truth="42", extra_info={}) == 0.0
    assert compute_score(data_source="my_task", solution_str="", ground_truth="42", extra_info={}) == 0.0
    assert compute_score(data_source="arithmetic", solution_str="#### 5", ground_truth="5", extra_info={}) == 1.0
    with pytest.raises(NotImplementedError, match="custom_reward_function.path"):
        compute_score(data_source="unknown_set", solution_str="x", ground_truth="x", extra_info={})


def test_tool_loads_by_class_path_and_runs(example_module, tmp_path):
    from verl.workers.tools import ToolManager

    example_module("tool", "my_tools")
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"capital_of_x": "Ypsilon"}))
    config = {"tool_instances": {"lookup": {"class_path": "my_tools.LookupTool",
                                            "params": {"facts_path": str(facts)}}}}

    with ToolManager.from_config(config) as tools:
        assert tools.stop_strings == ["</lookup>"]
        found, missing = tools.run([("lookup", " capital_of_x\n"), ("lookup", "capital_of_z")])

    assert (found.text, found.success) == ("Ypsilon", True)
    assert not missing.success and "no fact named 'capital_of_z'" in missing.text
    assert missing.attempts == 1  # a ToolError is not retried unless marked retryable


class NextTokenModel(torch.nn.Module):
    """A model whose logits depend only on the current token: row t of `table` (a stand-in for a HF causal LM)."""

    def __init__(self, vocab_size: int, step: int):
        super().__init__()
        self.table = torch.nn.Embedding(vocab_size, vocab_size)
        with torch.no_grad():
            self.table.weight.copy_(next_token_table(vocab_size, step))

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.table(input_ids))


def next_token_table(vocab_size: int, step: int) -> torch.Tensor:
    """Logits under which token t is followed by t + step (mod vocab_size) with near certainty."""
    table = torch.full((vocab_size, vocab_size), -10.0)
    table[torch.arange(vocab_size), (torch.arange(vocab_size) + step) % vocab_size] = 10.0
    return table


def test_rollout_engine_is_found_by_name_and_generates_a_batch(run_example):
    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.layout import generate_sequences
    from verl.workers.rollout.registry import get_rollout_cls

    run_example("rollout_engine")
    engine_cls = get_rollout_cls("greedy")
    assert issubclass(engine_cls, rollout_base.RolloutEngine)
    eos = 5
    # Built with the keywords the worker passes (fsdp_workers.ActorRolloutRefWorker.init_model).
    engine = engine_cls.build(model_path="unused", tokenizer=SimpleNamespace(eos_token_id=eos), config=None,
                              device="cpu", seed=None, load_module=lambda: NextTokenModel(8, step=1),
                              weights_follow=True, tokenizer_path=None, trust_remote_code=False, hf_overrides=None)
    prompts = DataProto.from_dict(tensors={"input_ids": torch.tensor([[1, 2], [0, 6]]),
                                           "attention_mask": torch.tensor([[1, 1], [0, 1]]),
                                           "position_ids": torch.tensor([[0, 1], [0, 0]])})

    out = generate_sequences(engine, prompts, SamplingParams(n=2, max_tokens=4), response_length=5,
                             pad_token_id=0, eos_token_id=eos)

    assert out.batch["responses"].tolist() == [[3, 4, 5, 0, 0]] * 2 + [[7, 0, 1, 2, 0]] * 2
    assert out.batch["response_mask"].tolist() == [[1, 1, 1, 0, 0]] * 2 + [[1, 1, 1, 1, 0]] * 2
    assert list(out.non_tensor_batch["finish_reason"]) == ["stop", "stop", "length", "length"]
    assert out.batch["rollout_log_probs"][0, :3].max() > -1e-3  # near-certain greedy tokens

    engine.update_weights((name, tensor) for name, tensor in {"table.weight": next_token_table(8, 2)}.items())
    assert engine.generate([[1]], SamplingParams(max_tokens=2))[0][0].token_ids == [3, 5]
