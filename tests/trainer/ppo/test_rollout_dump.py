"""verl/trainer/ppo/rollout_dump.py: skip.rollout's dumps (atomic, one per generation call) and their replay, which
refuses a dump of other prompts by the file's name."""

import os

import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo import rollout_dump
from verl.trainer.ppo.rollout_dump import RolloutReplay, load_rollouts, replay_rollouts, save_rollouts
from verl.utils.config import ConfigError

N = 2


def prompts(ids: list[list[int]], uids: list[str]) -> tuple[DataProto, DataProto]:
    """(rows, gen_batch) of prompts with these token ids and group ids, as the rollout phase splits them."""
    input_ids = torch.tensor(ids)
    gen_batch = DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
                 "position_ids": torch.arange(input_ids.shape[1]).expand_as(input_ids)},
        non_tensors={"raw_prompt_ids": [list(row) for row in ids]}, meta_info={"global_steps": 1})
    rows = DataProto.from_dict(non_tensors={"uid": uids, "reward_model": [{"ground_truth": str(sum(row))}
                                                                          for row in ids]})
    return rows, gen_batch


def generated(gen_batch: DataProto, offset: int = 100) -> DataProto:
    """What generation returns for `gen_batch`: N responses per prompt, adjacent, with metrics."""
    repeated = gen_batch.repeat(N, interleave=True)
    responses = torch.arange(len(repeated) * 3).reshape(len(repeated), 3) + offset
    return DataProto.from_dict(tensors={"prompts": repeated.batch["input_ids"], "responses": responses},
                               non_tensors=dict(repeated.non_tensor_batch),
                               meta_info={"metrics": {"rollout/seconds": [1.0]}, **gen_batch.meta_info})


def test_a_dump_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    rows, gen_batch = prompts([[1, 2], [3, 4]], ["a", "b"])
    path = str(tmp_path / "run" / "1" / "gen_batch_0.pt")
    save_rollouts(path, rows, gen_batch, generated(gen_batch))
    assert os.listdir(tmp_path / "run" / "1") == ["gen_batch_0.pt"]
    _, _, output = load_rollouts(path)
    assert "metrics" not in output.meta_info and torch.equal(output.batch["responses"], generated(gen_batch).batch[
        "responses"])

    def torn_write(obj, f):
        f.write(b"half a dump")
        raise OSError("disk full")

    monkeypatch.setattr(rollout_dump.torch, "save", torn_write)
    with pytest.raises(OSError, match="disk full"):
        save_rollouts(path, rows, gen_batch, generated(gen_batch, offset=500))
    monkeypatch.undo()
    assert os.listdir(tmp_path / "run" / "1") == ["gen_batch_0.pt"]  # no temporary file left
    _, _, output = load_rollouts(path)  # the earlier dump, intact
    assert output.batch["responses"].min() == 100


def test_a_replay_of_the_same_prompts_keeps_the_steps_rows_and_group_ids(tmp_path):
    rows, gen_batch = prompts([[1, 2], [3, 4]], ["a", "b"])
    gen_batch.non_tensor_batch["uid"] = rows.non_tensor_batch["uid"]  # agent loops read every column
    path = str(tmp_path / "gen_batch_0.pt")
    save_rollouts(path, rows, gen_batch, generated(gen_batch))
    new_rows, new_gen_batch = prompts([[1, 2], [3, 4]], ["c", "d"])  # the next run: same prompts, new group ids
    new_gen_batch.non_tensor_batch["uid"] = new_rows.non_tensor_batch["uid"]
    kept_rows, kept_gen_batch, output = replay_rollouts(path, new_rows, new_gen_batch, N, same_prompts=True)
    assert kept_rows is new_rows and kept_gen_batch is new_gen_batch
    assert torch.equal(output.batch["responses"], generated(gen_batch).batch["responses"])
    assert output.non_tensor_batch["uid"].tolist() == ["c", "c", "d", "d"]
    joined = new_rows.repeat(N, interleave=True).union(output)  # as the rollout phase joins them
    assert len(joined) == 4


@pytest.mark.parametrize("ids, why", [
    ([[1, 2], [3, 5]], r"the prompt ids of 1 of its 2 prompts differ \(the first: row 1\)"),
    ([[1, 2, 0], [3, 4, 0]], r"its prompt ids are \(2, 2\), the step's \(2, 3\)"),
    ([[1, 2], [3, 4], [5, 6]], "it holds the rollouts of 2 prompts, the step's batch has 3"),
])
def test_a_dump_of_other_prompts_is_refused_by_its_files_name(tmp_path, ids, why):
    rows, gen_batch = prompts([[1, 2], [3, 4]], ["a", "b"])
    path = str(tmp_path / "gen_batch_0.pt")
    save_rollouts(path, rows, gen_batch, generated(gen_batch))
    new_rows, new_gen_batch = prompts(ids, [str(i) for i in range(len(ids))])
    with pytest.raises(ValueError, match=f"skip.rollout: the dump {path} does not fit this step's batch: {why}"):
        replay_rollouts(path, new_rows, new_gen_batch, N, same_prompts=True)


def test_a_dump_with_a_wrong_number_of_rollouts_is_refused(tmp_path):
    rows, gen_batch = prompts([[1, 2], [3, 4]], ["a", "b"])
    path = str(tmp_path / "gen_batch_0.pt")
    save_rollouts(path, rows, gen_batch, generated(gen_batch).slice(0, 3))
    with pytest.raises(ValueError, match=r"it holds 3 rollouts, not 2 prompts x actor_rollout_ref.rollout.n=2 = 4"):
        replay_rollouts(path, rows, gen_batch, N, same_prompts=True)


class Generation:
    """A stand-in for the engines: counts its calls; each call's responses differ."""

    def __init__(self):
        self.calls = 0

    def __call__(self, gen_batch: DataProto) -> DataProto:
        self.calls += 1
        return generated(gen_batch, offset=100 * self.calls)


def test_cache_dumps_each_generation_call_of_a_listed_step_then_replays_it(tmp_path):
    first, generate = RolloutReplay(str(tmp_path), [1], "cache"), Generation()
    outputs = [first.rollouts(1, *prompts([[1, 2], [3, 4]], ["a", "b"]), N, generate) for _ in range(2)]
    assert generate.calls == 2 and not any(replayed for *_, replayed in outputs)
    assert sorted(os.listdir(tmp_path / "1")) == ["gen_batch_0.pt", "gen_batch_1.pt"]  # e.g. DAPO's second batch
    *_, replayed = first.rollouts(2, *prompts([[5, 6], [7, 8]], ["e", "f"]), N, generate)  # step 2 is not listed
    assert generate.calls == 3 and not replayed and not (tmp_path / "2").exists()

    again, idle = RolloutReplay(str(tmp_path), [1], "cache"), Generation()
    for call in range(2):
        rows, _, output, replayed = again.rollouts(1, *prompts([[1, 2], [3, 4]], ["c", "d"]), N, idle)
        assert replayed and torch.equal(output.batch["responses"], outputs[call][2].batch["responses"])
        assert rows.non_tensor_batch["uid"].tolist() == ["c", "d"]
    assert idle.calls == 0
    *_, replayed = again.rollouts(1, *prompts([[1, 2], [3, 4]], ["c", "d"]), N, idle)  # a third call: no dump yet
    assert idle.calls == 1 and not replayed and (tmp_path / "1" / "gen_batch_2.pt").exists()


def test_repeat_replays_the_nearest_steps_dump_with_its_prompts_under_this_steps_group_ids(tmp_path):
    generate = Generation()
    replay = RolloutReplay(str(tmp_path), [1, 3, 4, 6], "repeat")
    *_, dumped, replayed = replay.rollouts(4, *prompts([[1, 2], [3, 4]], ["a", "b"]), N, generate)
    assert not replayed and generate.calls == 1
    rows, gen_batch, output, replayed = replay.rollouts(3, *prompts([[9, 9], [8, 8]], ["c", "d"]), N, generate)
    assert replayed and generate.calls == 1  # no dump of step 3, none before it: the earliest after, step 4
    assert torch.equal(gen_batch.batch["input_ids"], torch.tensor([[1, 2], [3, 4]]))
    assert [row["ground_truth"] for row in rows.non_tensor_batch["reward_model"]] == ["3", "7"]
    assert rows.non_tensor_batch["uid"].tolist() == ["c", "d"]
    assert torch.equal(output.batch["responses"], dumped.batch["responses"])
    assert output.meta_info["global_steps"] == 1  # the step's own meta-info, not the dump's
    *_, replayed = replay.rollouts(6, *prompts([[1, 1], [2, 2]], ["g", "h"]), N, generate)
    assert replayed and generate.calls == 1  # the latest before: step 4
    fresh = RolloutReplay(str(tmp_path / "fresh"), [6], "repeat")
    *_, replayed = fresh.rollouts(6, *prompts([[1, 1], [2, 2]], ["g", "h"]), N, generate)
    assert not replayed and generate.calls == 2 and (tmp_path / "fresh" / "6" / "gen_batch_0.pt").exists()


def config(**skip):
    return OmegaConf.create({
        "skip": {"rollout": {"enable": True, "dump_dir": "/dumps", "steps": [1, 2], "action": "cache", **skip}},
        "trainer": {"experiment_name": "exp", "project_name": "proj"}, "actor_rollout_ref": {"rollout": {"n": 4}},
        "data": {"max_prompt_length": 64, "max_response_length": 16}})


def test_the_run_dump_directory_is_keyed_by_experiment_and_batch_shape(capsys):
    replay = RolloutReplay.from_config(config(), 8, "sync")
    assert replay.root == "/dumps/exp_proj/GBS8_N4_in64_out16" and replay.steps == {1, 2}
    assert replay.path(2, 0) == "/dumps/exp_proj/GBS8_N4_in64_out16/2/gen_batch_0.pt"
    assert "[skip.rollout] steps [1, 2]" in capsys.readouterr().out
    assert RolloutReplay.from_config(config(enable=False), 8, "colocate_async") is None
    RolloutReplay.from_config(config(steps=[]), 8, "sync")
    assert "skip.rollout.steps=[] lists no step" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_replay_is_refused_in_the_asynchronous_modes_in_one_line_naming_the_key(mode):
    with pytest.raises(ConfigError) as err:
        RolloutReplay.from_config(config(), 8, mode)
    message = str(err.value)
    assert "\n" not in message and message.startswith("skip.rollout.enable=true: replaying dumped rollouts runs in "
                                                      "the synchronous trainer only (trainer.v1.trainer_mode=sync)")
    assert f"this run's mode is {mode}" in message

