"""`data.sampler.class_path` / `class_name` end to end on the tiny model and 2 CPU ranks: a curriculum sampler of the
user's (a file in tmp_path) picks each step's prompts, and its update() gets each step's trained batch, after the
step and before the next step draws, so its updates decide what comes next; a run resumed from a checkpoint
continues with the sampler's position and state."""

import json

import pytest
import torch
from e2e_utils import build_trainer, fit_keeping_batches, tiny_overrides

pytestmark = pytest.mark.e2e

# Each update moves the rows still to come by 100: step 1 trains on rows 0-7, step 2 on 108-115, step 3 on 216-223.
SAMPLER = '''
import json

from verl.experimental.dataset.sampler import AbstractCurriculumSampler


class ShiftingCurriculum(AbstractCurriculumSampler):
    def __init__(self, data_source, data_config):
        self.n, self.shift = len(data_source), 0

    def __iter__(self):
        for position in range(self.n):
            yield (position + self.shift) % self.n

    def __len__(self):
        return self.n

    def update(self, batch):
        with open({record!r}, "a") as f:
            f.write(json.dumps({{"rows": sorted(set(int(i) for i in batch.non_tensor_batch["index"])),
                                 "size": len(batch), "scored": "token_level_scores" in batch.batch,
                                 "advantages": "advantages" in batch.batch}}) + "\\n")
        self.shift += 100

    def state_dict(self):
        return {{"shift": self.shift}}

    def load_state_dict(self, state):
        self.shift = state["shift"]
'''


def test_a_curriculum_sampler_picks_the_rows_and_sees_each_steps_batch(ray_session, tiny_model_dir,
                                                                      arithmetic_data_dir, tmp_path):
    record = tmp_path / "updates.jsonl"
    sampler_file = tmp_path / "shifting_curriculum.py"
    sampler_file.write_text(SAMPLER.format(record=str(record)))
    extra = [f"data.sampler.class_path={sampler_file}", "data.sampler.class_name=ShiftingCurriculum",
             "trainer.test_freq=-1", "trainer.save_freq=2"]
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    trainer = build_trainer(tiny_overrides(tiny_model_dir, arithmetic_data_dir, *extra,
                                           f"trainer.default_local_dir={straight_dir}"), tiny_model_dir)
    history, batches = fit_keeping_batches(trainer)
    assert len(history) == 3
    updates = [json.loads(line) for line in record.read_text().splitlines()]
    expected = [list(range(0, 8)), list(range(108, 116)), list(range(216, 224))]
    assert [u["rows"] for u in updates] == expected  # 3 updates, each with its step's prompts (4 responses each)
    assert all(u["size"] == 32 and u["scored"] and u["advantages"] for u in updates)
    assert [sorted(set(int(i) for i in b.non_tensor_batch["index"])) for b in batches] == expected
    saved = torch.load(straight_dir / "global_step_3" / "data.pt", weights_only=False)["dataloader"]
    assert saved["_sampler_iter_state"]["sampler_state"] == {"position": 24, "sampler": {"shift": 300}}

    # Resumed from step 2, the sampler's position and its own state come back: step 3 trains on the same rows.
    trainer = build_trainer(tiny_overrides(tiny_model_dir, arithmetic_data_dir, *extra,
                                           f"trainer.default_local_dir={resumed_dir}", "trainer.resume_mode=resume_path",
                                           f"trainer.resume_from_path={straight_dir / 'global_step_2'}"), tiny_model_dir)
    history, _ = fit_keeping_batches(trainer)
    assert [m["training/global_step"] for m in history] == [3]
    assert json.loads(record.read_text().splitlines()[-1])["rows"] == expected[2]
