"""The batch-filter strategies (verl/trainer/ppo/batch_filters.py) on hand-built scored sub-batches: which groups
each keeps, when it asks for more generation, its per-step metrics, and its checkpoint state."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo.batch_filters import (
    BATCH_FILTER_REGISTRY,
    BatchFilter,
    BatchFilterChain,
    DapoRefillFilter,
    EmaStdBatchFilter,
    RefillTarget,
    RejectionSampleFilter,
    build_batch_filter,
    get_batch_filter_cls,
    register_batch_filter,
)
from verl.trainer.ppo.filters import EmaStdFilter

N = 2  # responses per group


def sub_batch(groups: dict[str, list[float]], prompt_len: int = 3, **columns) -> DataProto:
    """One group per uid with these scores (on the last response token), prompts [uid's code, ...] left padded."""
    uids = [uid for uid, scores in groups.items() for _ in scores]
    scores = [s for group in groups.values() for s in group]
    rows = len(scores)
    token_level_scores = torch.zeros(rows, 2)
    token_level_scores[:, -1] = torch.tensor(scores)
    prompts = torch.tensor([[0] * (prompt_len - 1) + [ord(uid[0])] for uid in uids])
    prompt_mask = torch.tensor([[0] * (prompt_len - 1) + [1]] * rows)
    attention = torch.cat([prompt_mask, torch.ones(rows, 2, dtype=torch.long)], 1)
    non_tensors = {"uid": np.array(uids, dtype=object), "data_source": np.array(["src"] * rows, dtype=object),
                   "reward_model": np.array([{"ground_truth": uid} for uid in uids], dtype=object)}
    non_tensors.update({key: np.array(values, dtype=object) for key, values in columns.items()})
    return DataProto.from_dict(
        tensors={"token_level_scores": token_level_scores, "prompts": prompts, "responses": torch.ones(rows, 2),
                 "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp(min=0)},
        non_tensors=non_tensors)


def config(**overrides):
    """The config keys the filters read, all off, with `overrides` (dotted keys) applied."""
    cfg = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"n": N}},
        "data": {"train_batch_size": 2, "gen_batch_size": None, "reward_fn_key": "data_source"},
        "trainer": {"rejection_sample": False},
        "algorithm": {"filter_groups": {"enable": False, "metric": "seq_reward", "max_num_gen_batches": 0},
                      "filter_mode": "default", "std_filter_beta": 0.5, "filter_ema_ratio": 0.9,
                      "filter_ema_start_step": 1, "filter_start_step": 2, "filter_cache_regenerate": True,
                      "resume_ema_mean": None, "std_filter_beta_per_data_source": None}})
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def uids_of(batch: DataProto) -> list[str]:
    return list(dict.fromkeys(batch.non_tensor_batch["uid"]))


# ----------------------------------------------------------------------------------------------- factory, registry
def test_the_factory_builds_what_the_config_turns_on():
    assert build_batch_filter(config()).filters == {}
    assert list(build_batch_filter(config(**{"trainer.rejection_sample": True})).filters) == ["rejection_sample"]
    assert list(build_batch_filter(config(**{"algorithm.filter_groups.enable": True})).filters) == ["filter_groups"]
    both = build_batch_filter(config(**{"trainer.rejection_sample": True, "algorithm.filter_mode": "ema_std"}))
    assert list(both.filters) == ["rejection_sample", "ema_std"]  # registration order: Archer's filter runs first
    assert isinstance(both.filters["ema_std"], EmaStdBatchFilter)
    assert get_batch_filter_cls("filter_groups") is DapoRefillFilter


def test_no_filter_passes_everything_through():
    chain = build_batch_filter(config())
    chain.begin_step(1)
    batch = sub_batch({"a": [1, 1], "b": [0, 1]})
    assert chain.next_prompts(iter([{"x": 1}])) == {"x": 1}
    kept, stats = chain.filter(batch)
    assert kept is batch and stats == {} and not chain.needs_more(len(kept))
    assert chain.finish_step(kept) == (kept, {}) and chain.state_dict() == {}


def test_registering_a_new_filter_and_a_taken_name():
    @register_batch_filter("test_keep_first_group")
    class KeepFirstGroup(BatchFilter):
        @classmethod
        def from_config(cls, config):
            return cls() if config.get("keep_first_group") else None

        def filter(self, batch):
            first = batch.non_tensor_batch["uid"][0]
            return batch.select_idxs(batch.non_tensor_batch["uid"] == first), {}

    try:
        chain = build_batch_filter(config(keep_first_group=True))
        assert list(chain.filters) == ["test_keep_first_group"]
        assert uids_of(chain.filter(sub_batch({"a": [0, 1], "b": [0, 1]}))[0]) == ["a"]
        with pytest.raises(ValueError, match="Batch filter 'ema_std' is already registered"):
            register_batch_filter("ema_std")(KeepFirstGroup)
    finally:
        BATCH_FILTER_REGISTRY.pop("test_keep_first_group")


def test_at_most_one_filter_may_supply_prompts():
    ema = EmaStdBatchFilter(EmaStdFilter(0.5, 0.9, 1, 2), RefillTarget(N, 2), prompt_batch_size=2)
    with pytest.raises(ValueError, match="each supply their own prompts"):
        BatchFilterChain({"one": ema, "two": ema})


# ----------------------------------------------------------------------------------------------- Archer
def test_rejection_sample_drops_groups_without_signal_and_never_asks_for_more():
    f = RejectionSampleFilter.from_config(config(**{"trainer.rejection_sample": True}))
    f.begin_step(3)
    kept, stats = f.filter(sub_batch({"a": [1, 1], "b": [0, 1], "c": [0, 0], "d": [0.5, 1]}))
    assert uids_of(kept) == ["b", "d"] and stats["kept_groups"] == 2 and stats["dropped_groups"] == 2
    assert not f.needs_more(len(kept))
    batch, metrics = f.finish_step(kept)
    assert batch is kept  # the batch shrinks: nothing is trimmed or refilled
    assert metrics == {"batch/kept_groups": 2, "batch/dropped_groups": 2, "batch/solve_all": 1,
                       "batch/solve_none": 1, "batch/num_gen_batches": 1, "batch/groups_regenerated": 0}
    f.begin_step(4)  # counts are per step
    assert f.finish_step(kept)[1]["batch/kept_groups"] == 0
    assert f.state_dict() == {}


# ----------------------------------------------------------------------------------------------- DAPO
def test_dapo_refills_until_the_batch_is_full_then_trims(capsys):
    f = DapoRefillFilter.from_config(config(**{"algorithm.filter_groups.enable": True}))
    f.begin_step(1)
    kept, _ = f.filter(sub_batch({"a": [1, 1], "b": [0, 1], "c": [0, 0]}))
    assert uids_of(kept) == ["b"] and f.needs_more(len(kept))
    assert "[filter_groups] 1/2 groups with a reward signal after 1 generation batches; generating another" in \
        capsys.readouterr().out
    more, _ = f.filter(sub_batch({"d": [0, 1], "e": [1, 0], "f": [1, 1]}))
    batch = DataProto.concat([kept, more])
    assert not f.needs_more(len(batch))
    batch, metrics = f.finish_step(batch)
    assert uids_of(batch) == ["b", "d"]  # train_batch_size=2 groups; group e is surplus
    assert metrics == {"batch/kept_groups": 3, "batch/dropped_groups": 3, "batch/solve_all": 2,
                       "batch/solve_none": 1, "batch/num_gen_batches": 2, "batch/groups_regenerated": 3}


def test_dapo_filters_on_the_configured_metric_and_gives_up_at_the_limit():
    f = DapoRefillFilter.from_config(config(**{"algorithm.filter_groups.enable": True,
                                               "algorithm.filter_groups.metric": "acc",
                                               "algorithm.filter_groups.max_num_gen_batches": 1}))
    f.begin_step(1)
    # Scores differ within both groups, but only group b's accuracies do.
    kept, _ = f.filter(sub_batch({"a": [0.9, 1.0], "b": [0, 1]}, acc=[1, 1, 0, 1]))
    assert uids_of(kept) == ["b"]
    with pytest.raises(RuntimeError, match=r"only 1 of data.train_batch_size=2 groups .*max_num_gen_batches=1"):
        f.needs_more(len(kept))


# ----------------------------------------------------------------------------------------------- RLPR
def ema_filter(**overrides) -> EmaStdBatchFilter:
    return EmaStdBatchFilter.from_config(config(**{"algorithm.filter_mode": "ema_std", **overrides}))


def test_ema_std_warm_up_keeps_everything_and_feeds_the_training_batch():
    f = ema_filter()
    f.begin_step(1)
    batch = sub_batch({"a": [1, 1], "b": [0, 1], "c": [0, 2]})
    kept, stats = f.filter(batch)
    assert kept is batch and stats == {} and not f.needs_more(len(kept))
    out, metrics = f.finish_step(kept)
    assert out is batch  # no threshold yet: no trimming
    assert metrics["batch/std_mean"] == pytest.approx((0 + math.sqrt(0.5) + math.sqrt(2)) / 3)
    assert math.isnan(metrics["batch/std_threshold"]) and metrics["batch/prompt_cache"] == 0
    assert "batch/std_kept_groups" not in metrics
    assert f.std_filter.ema == pytest.approx(metrics["batch/std_mean"])  # step 1 was the whole warm-up


def test_ema_std_drops_low_std_groups_refills_and_caches_the_surplus(capsys):
    f = ema_filter()
    f.std_filter.ema = 1.0  # threshold 0.5 from step 2
    f.begin_step(2)
    tensors = {key: torch.zeros(3, 3) for key in ("input_ids", "attention_mask", "position_ids")}
    prompts = iter([{**tensors, "data_source": np.array(["src"] * 3, dtype=object),
                     "reward_model": np.array([{}] * 3, dtype=object)}])
    assert f.next_prompts(prompts)["input_ids"].shape == (3, 3)
    assert f.prompt_keys == ["data_source", "reward_model"]  # recorded from the prompt batch itself
    # stds: a 0, b 0.707, c 0.071
    kept, stats = f.filter(sub_batch({"a": [1, 1], "b": [0, 1], "c": [0, 0.1]}))
    assert uids_of(kept) == ["b"] and stats == {"std_kept_groups": 1, "std_dropped_groups": 2}
    assert f.needs_more(len(kept))
    assert "[filter_groups] 1/2 groups" in capsys.readouterr().out
    more, _ = f.filter(sub_batch({"d": [0, 2], "e": [2, 0], "g": [3, 3]}))
    batch = DataProto.concat([kept, more])
    assert not f.needs_more(len(batch))
    batch, metrics = f.finish_step(batch)
    assert uids_of(batch) == ["b", "d"]
    assert metrics["batch/std_kept_groups"] == 3 and metrics["batch/std_dropped_groups"] == 3
    assert metrics["batch/num_gen_batches"] == 2 and metrics["batch/prompt_cache"] == 1
    assert metrics["batch/std_mean"] == pytest.approx((0 + 2 ** -0.5 + 0.1 * 2 ** -0.5 + 2 * 2 ** 0.5 + 0) / 6)
    assert metrics["batch/std_threshold"] == pytest.approx(0.5 * (0.9 + 0.1 * metrics["batch/std_mean"]))
    [cached] = f.prompt_cache  # group e's prompt, once, with the prompt batch's columns only
    assert cached["input_ids"].tolist() == [0, 0, ord("e")] and cached["attention_mask"].tolist() == [0, 0, 1]
    assert set(cached) == {"input_ids", "attention_mask", "position_ids", "data_source", "reward_model"}


def test_ema_std_scales_stds_by_data_source():
    f = ema_filter(**{"algorithm.std_filter_beta_per_data_source": "src_is_10"})
    f.std_filter.ema = 1.0
    f.begin_step(2)
    kept, _ = f.filter(sub_batch({"c": [0, 0.1]}))  # std 0.071 x 10 clears 0.5
    assert uids_of(kept) == ["c"]


def test_the_prompt_cache_comes_back_as_a_whole_batch_first():
    f = ema_filter(**{"data.gen_batch_size": 2})
    f.begin_step(2)
    f.prompt_keys = ["data_source", "raw_prompt_ids"]
    f.cache_prompts(sub_batch({"a": [0, 1], "b": [0, 1]}, finish_reason=["stop"] * 4))
    assert len(f.prompt_cache) == 2  # one prompt per group
    loader = iter([{"from": "loader"}])
    batch = f.next_prompts(loader)  # the cache holds a whole batch: it goes first
    assert batch["input_ids"].tolist() == [[0, 0, ord("a")], [0, 0, ord("b")]]
    assert batch["data_source"].tolist() == ["src", "src"] and "finish_reason" not in batch
    assert f.prompt_cache == [] and f.next_prompts(loader) == {"from": "loader"}


def test_ema_std_state_round_trips_with_the_prompt_cache():
    chain = build_batch_filter(config(**{"algorithm.filter_mode": "ema_std"}))
    f = chain.filters["ema_std"]
    f.begin_step(1)
    f.finish_step(f.filter(sub_batch({"a": [0, 1]}))[0])
    f.prompt_keys = ["data_source"]
    f.cache_prompts(sub_batch({"b": [0, 1]}))
    saved = chain.state_dict()
    assert set(saved["ema_std"]) == {"std_filter", "prompt_cache"}
    restored = build_batch_filter(config(**{"algorithm.filter_mode": "ema_std"}))
    restored.load_state_dict(saved)
    g = restored.filters["ema_std"]
    assert g.std_filter.ema == f.std_filter.ema and g.std_filter.warmup_means == f.std_filter.warmup_means
    assert len(g.prompt_cache) == 1 and g.prompt_cache[0]["data_source"] == "src"
    assert g.prompt_cache is not f.prompt_cache
    fresh = build_batch_filter(config(**{"trainer.rejection_sample": True}))
    fresh.load_state_dict(saved)  # a saved filter that is off now is ignored


# ----------------------------------------------------------------------------------------------- checkpoints
class StubWorkers:
    def save_checkpoint(self, path, global_step):
        os.makedirs(path)
        open(os.path.join(path, "fsdp_config.json"), "w").close()

    def load_checkpoint(self, path):
        pass


class StubLoader:
    def __len__(self):
        return 10

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def stub_trainer(tmp_path, **overrides):
    """A RayPPOTrainer without workers or data: enough for _save_checkpoint / _load_checkpoint."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    cfg = config(**{"algorithm.filter_mode": "ema_std", "algorithm.use_kl_in_reward": False,
                    "trainer.default_local_dir": str(tmp_path), "trainer.resume_mode": "auto",
                    "trainer.max_actor_ckpt_to_keep": None, "trainer.critic_warmup": 0, **overrides})
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.config, trainer.global_steps, trainer.epoch = cfg, 1, 0
    trainer.actor_version, trainer._stream = 1, None
    trainer.use_critic = False
    trainer.actor_rollout_wg = StubWorkers()
    trainer.train_dataloader = StubLoader()
    trainer.batch_filter = build_batch_filter(cfg)
    return trainer


def test_the_trainer_checkpoints_the_filter_state(tmp_path):
    trainer = stub_trainer(tmp_path)
    trainer.batch_filter.filters["ema_std"].std_filter.ema = 0.25
    trainer.batch_filter.filters["ema_std"].prompt_cache = [{"data_source": "src"}]
    trainer._save_checkpoint()
    resumed = stub_trainer(tmp_path)
    resumed._load_checkpoint()
    assert resumed.batch_filter.filters["ema_std"].std_filter.ema == 0.25
    assert resumed.batch_filter.filters["ema_std"].prompt_cache == [{"data_source": "src"}]


def test_an_old_checkpoint_with_the_std_filter_at_the_top_still_loads(tmp_path):
    step_dir = tmp_path / "global_step_1"
    StubWorkers().save_checkpoint(str(step_dir / "actor"), 1)
    torch.save({"global_steps": 1, "epoch": 0, "dataloader": {}, "std_filter": {"ema": 0.5, "warmup_means": [0.5]},
                "prompt_cache": [{"data_source": "old"}]}, step_dir / "data.pt")
    resumed = stub_trainer(tmp_path)
    resumed._load_checkpoint()
    f = resumed.batch_filter.filters["ema_std"]
    assert f.std_filter.ema == 0.5 and f.std_filter.warmup_means == [0.5]
    assert f.prompt_cache == [{"data_source": "old"}]
