"""The trainer's cache of surplus prompts (RLPR's filter_cache_regenerate): one row per group, regenerated as a batch."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer


def test_surplus_groups_are_cached_once_each_and_come_back_as_a_batch():
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.prompt_cache = []
    trainer.train_dataloader = SimpleNamespace(batch_size=2)
    prompts = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]])
    surplus = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": torch.ones(4, 2, dtype=torch.long),
                 "attention_mask": torch.tensor([[0, 1, 1, 1, 1]] * 2 + [[1, 1, 1, 1, 0]] * 2),
                 "position_ids": torch.tensor([[0, 0, 1, 2, 3]] * 2 + [[0, 1, 2, 3, 4]] * 2)},
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object),
                     "data_source": np.array(["s1", "s1", "s2", "s2"], dtype=object),
                     "finish_reason": np.array(["stop"] * 4, dtype=object)})
    trainer._cache_prompts(surplus, ["data_source", "raw_prompt_ids"])
    assert len(trainer.prompt_cache) == 2  # one prompt per group
    loader = iter([{"from": "loader"}])
    batch = trainer._next_prompts(loader)  # the cache holds a whole batch: it goes first
    assert batch["input_ids"].tolist() == [[0, 5, 6], [7, 8, 9]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert batch["data_source"].tolist() == ["s1", "s2"] and "finish_reason" not in batch
    assert trainer.prompt_cache == [] and trainer._next_prompts(loader) == {"from": "loader"}
