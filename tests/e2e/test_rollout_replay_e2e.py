"""skip.rollout end to end on the tiny model and 2 CPU ranks: a 2-step run dumps its rollouts; a second run of the
same seed and config replays them without generating, and trains on the same responses."""

import math
import os

import pytest
import torch
from e2e_utils import build_trainer, fit_keeping_batches, tiny_overrides

from verl.trainer.ppo.rollout_dump import load_rollouts

pytestmark = pytest.mark.e2e

SHORT = ["trainer.total_training_steps=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "trainer.test_freq=-1", "trainer.save_freq=-1"]


def run(tiny_model_dir, arithmetic_data_dir, dumps, run_dir):
    """(history, trained batches, generated responses per generation call, generation calls) of one run."""
    trainer = build_trainer(tiny_overrides(tiny_model_dir, arithmetic_data_dir, *SHORT, "skip.rollout.enable=true",
                                           f"skip.rollout.dump_dir={dumps}", "skip.rollout.steps=[1,2]",
                                           f"trainer.default_local_dir={run_dir}"), tiny_model_dir)
    responses, calls = [], []
    score, generate = trainer._score_rollout, trainer._generate_now

    def scoring(batch, gen_batch, output, *args):
        responses.append(output.batch["responses"].clone())
        return score(batch, gen_batch, output, *args)

    def generating(*args):
        calls.append(1)
        return generate(*args)

    trainer._score_rollout, trainer._generate_now = scoring, generating
    history, batches = fit_keeping_batches(trainer)
    return trainer, history, batches, responses, len(calls)


def test_a_second_run_replays_the_first_runs_rollouts_without_generating(ray_session, tiny_model_dir,
                                                                         arithmetic_data_dir, tmp_path, capsys):
    dumps = tmp_path / "dumps"
    first, history, batches, responses, calls = run(tiny_model_dir, arithmetic_data_dir, dumps, tmp_path / "run1")
    assert calls == 2 and [m["rollout/replayed"] for m in history] == [0.0, 0.0]
    assert all("timing_s/gen" in m for m in history)
    files = [first.rollout_replay.path(step, 0) for step in (1, 2)]
    assert all(os.path.isfile(path) for path in files)
    assert f"[skip.rollout] step 2: generated 16 rollouts, dumped to {files[1]}" in capsys.readouterr().out

    _, history2, batches2, responses2, calls2 = run(tiny_model_dir, arithmetic_data_dir, dumps, tmp_path / "run2")
    assert calls2 == 0  # no generation: every step replayed its dump
    assert f"[skip.rollout] step 1: replayed 16 rollouts from {files[0]} instead of generating" in capsys.readouterr().out
    assert [m["rollout/replayed"] for m in history2] == [1.0, 1.0]
    assert not any("timing_s/gen" in m for m in history2)
    for path, dumped, replayed in zip(files, responses, responses2):
        assert torch.equal(replayed, dumped) and torch.equal(replayed, load_rollouts(path)[2].batch["responses"])
    for batch, batch2 in zip(batches, batches2):  # the same rows, scored the same, are trained on
        assert torch.equal(batch.batch["responses"], batch2.batch["responses"])
        assert torch.equal(batch.batch["token_level_scores"], batch2.batch["token_level_scores"])
    assert all(math.isfinite(m["actor/pg_loss"]) for m in history2)
