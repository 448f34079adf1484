"""The rollout phase of a PPO step on the driver: prompts to generated, scored groups, as the batch filters keep them.

`RolloutPhase` is the part of `RayPPOTrainer` (ray_trainer.py) that turns dataloader batches into the step's
training batch: each prompt gets its group id and rollout.n responses (`_generate`, through the rollout stream when
generation runs ahead, rollout_stream.py; or a dump's, skip.rollout: rollout_dump.py), the reward model and the
reward manager score them, ReMax's greedy baseline is added, groups over the staleness bound and those the batch
filters drop leave, and the batch is cut to a multiple of the ranks. It reads the trainer's config, plan, worker
groups, batch filter, rollout replay, reward function and counters (global_steps, actor_version).
"""

from __future__ import annotations

import os
import uuid
from collections import defaultdict

import numpy as np
import torch

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.trainer.ppo.filters import overlong_filter, truncate_to_multiple
from verl.trainer.ppo.guards import check_reward_failures
from verl.trainer.ppo.metric_utils import phase_timer, reduce_metrics
from verl.trainer.ppo.reward import run_reward
from verl.trainer.ppo.staleness import VERSIONS, groups_over_bound, trajectory_staleness
from verl.utils.phases import Phase
from verl.utils.tracking import dump_generations

GEN_BATCH_KEYS = ["input_ids", "attention_mask", "position_ids"]


class RolloutPhase:
    """The rollout phase's methods of RayPPOTrainer (see the module docstring)."""

    def _score_with_reward_model(self, batch: DataProto, metrics: dict | None = None) -> DataProto:
        """With reward_model.enable, the reward model's `rm_scores` (its score on each response's last token) join
        the batch; the reward manager then uses them (see verl/workers/reward_manager/naive.py)."""
        if self.rm_wg is None:
            return batch
        tensors = ["input_ids", "attention_mask", "prompts", "responses"]
        columns = [key for key in ("raw_prompt",) if key in batch.non_tensor_batch]
        padded, pad_size = pad_dataproto_to_divisor(batch.select(batch_keys=tensors, non_tensor_batch_keys=columns),
                                                    self.rm_wg.world_size)
        scored = unpad_dataproto(self.rm_wg.compute_rm_score(padded), pad_size)
        for key, values in scored.meta_info.pop("metrics", {}).items():
            if metrics is not None:
                metrics[key].extend(values)
        return batch.union(scored)

    def _gen_batch(self, batch: DataProto) -> DataProto:
        """What generation reads, taken out of `batch`: the prompt tensors and ids; with verl's agent loops
        (mode=async) also a copy of every other column, which the loops take as keyword arguments (agent_name,
        tools_kwargs, raw_prompt, extra_info, ...)."""
        gen_batch = batch.pop(batch_keys=GEN_BATCH_KEYS, non_tensor_batch_keys=["raw_prompt_ids"])
        if self.plan.rollout.generation == "agent_loops":
            for key, values in batch.non_tensor_batch.items():
                gen_batch.non_tensor_batch.setdefault(key, values)
        return gen_batch

    def _generate(self, gen_batch: DataProto, n: int) -> DataProto:
        """`_generate_now`, after what the engines were given before (rollout_stream.py) when generation runs ahead,
        with the weights' version of the last push."""
        if self._stream is None:
            gen_batch.meta_info["policy_version"] = self.actor_version
            return self._generate_now(gen_batch, n)
        gen_batch.meta_info["policy_version"] = self._stream.version
        return self._stream.call(lambda: self._generate_now(gen_batch, n))

    def _generate_now(self, gen_batch: DataProto, n: int) -> DataProto:
        """n responses per prompt from the generating ranks (adjacent), padding to a multiple of their number.

        Plain sampling and verl's agent loops get every prompt n times; the tool loop, and the agent loops with ARPO's
        branching, get each prompt once with meta_info["n"]: they make a prompt's n trajectories together
        (branches of one another) on one rank.
        """
        group, ranks = self.generation_wg, self.plan.generation_ranks  # separate_async: the rollout ranks
        if self.plan.rollout.makes_groups:
            gen_batch.meta_info["n"] = n
            padded, pad_size = pad_dataproto_to_divisor(gen_batch, ranks)
            return unpad_dataproto(group.generate_sequences(padded), pad_size * n)
        padded, pad_size = pad_dataproto_to_divisor(gen_batch.repeat(n, interleave=True), ranks)
        return unpad_dataproto(group.generate_sequences(padded), pad_size)

    def _decode(self, batch: DataProto) -> tuple[list[str], list[str]]:
        """Prompt and response texts of a generated batch (for dumps and printed samples): the whole response the
        model saw, tool results included, as verl dumps it."""
        prompts = self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
        attended = batch.batch["attention_mask"][:, -batch.batch["responses"].shape[1]:]
        responses = [self.tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
                     for ids, mask in zip(batch.batch["responses"], attended)]
        return prompts, responses

    def _dump(self, directory: str | None, batch: DataProto, scores: list[float], extra_info: dict) -> None:
        """Write this step's prompts, responses, ground truths and scores as JSONL (`trainer.rollout_data_dir` and
        friends)."""
        if directory:
            prompts, responses = self._decode(batch)
            gts = [(row or {}).get("ground_truth") for row in batch.non_tensor_batch.get(
                "reward_model", [None] * len(batch))]
            dump_generations(prompts, responses, scores, extra_info, self.global_steps, os.path.expanduser(directory),
                             gts=gts)

    def _prepare_rollout(self, batch_dict: dict) -> tuple[DataProto, DataProto]:
        """One generation batch's rows (each prompt with its `uid`) and what generation reads of them."""
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        gen_batch = self._gen_batch(batch)
        gen_batch.meta_info["global_steps"] = self.global_steps
        return batch, gen_batch

    def _rollout_and_score(self, batch_dict: dict, gen_metrics: dict, timing: dict) -> tuple[DataProto, list[str]]:
        """Generate rollout.n responses per prompt of one generation batch, or replay a dump of them (skip.rollout;
        rollout/replayed says which), and score them.

        Returns the batch and the names of the reward manager's extra per-row columns.
        """
        batch, gen_batch = self._prepare_rollout(batch_dict)
        n = self.config.actor_rollout_ref.rollout.n

        def generate(prompts: DataProto) -> DataProto:
            with phase_timer(Phase.GENERATE.timer, timing):
                return self._generate(prompts, n)

        if self.rollout_replay is None:
            output = generate(gen_batch)
        else:
            batch, gen_batch, output, replayed = self.rollout_replay.rollouts(self.global_steps, batch, gen_batch, n,
                                                                              generate)
            gen_metrics["rollout/replayed"].append(float(replayed))
        return self._score_rollout(batch, gen_batch, output, gen_metrics, timing)

    def _launch_rollout(self, batch_dict: dict):
        """For the rollout stream: the batch prepared here, and its generation to run on the engine thread."""
        batch, gen_batch = self._prepare_rollout(batch_dict)
        n = self.config.actor_rollout_ref.rollout.n

        def generate(version: int) -> DataProto:
            gen_batch.meta_info["policy_version"] = version
            return self._generate_now(gen_batch, n)

        return (batch, gen_batch), generate

    def _streamed_rollout(self, prompt_batches, gen_metrics: dict, timing: dict) -> tuple[DataProto, list[str]] | None:
        """The stream's next generated batch, scored; None when the data ran out."""
        with phase_timer(Phase.GENERATE.timer, timing):
            launched = self._stream.next(lambda: self.batch_filter.next_prompts(prompt_batches))
        if launched is None:
            return None
        batch, gen_batch = launched.prepared
        return self._score_rollout(batch, gen_batch, launched.future.result(), gen_metrics, timing)

    def _score_rollout(self, batch: DataProto, gen_batch: DataProto, output: DataProto, gen_metrics: dict,
                       timing: dict) -> tuple[DataProto, list[str]]:
        """The generated responses joined to their prompts' rows, scored (and ReMax's greedy baselines)."""
        n = self.config.actor_rollout_ref.rollout.n
        for key, values in output.meta_info.pop("metrics", {}).items():
            gen_metrics[key].extend(values)
        baselines = None
        if self.plan.greedy_baseline:
            with phase_timer(Phase.GENERATE_GREEDY.timer, timing):
                baselines = self._greedy_baselines(batch, gen_batch)
        batch = batch.repeat(n, interleave=True).union(output)
        if baselines is not None:
            batch.batch["reward_baselines"] = baselines.repeat_interleave(n)

        with phase_timer(Phase.REWARD.timer, timing):
            batch = self._score_with_reward_model(batch, gen_metrics)
            reward_tensor, reward_extra_info, reward_metrics = run_reward(batch, self.reward_fn)
            check_reward_failures(reward_metrics, self.config.trainer.max_bad_reward_fraction, self.global_steps)
            for key, value in reward_metrics.items():
                gen_metrics[key].append(value)
            batch.batch["token_level_scores"] = reward_tensor
            for key, values in reward_extra_info.items():
                column = np.empty(len(values), dtype=object)
                column[:] = values
                batch.non_tensor_batch[key] = column
        return batch, list(reward_extra_info)

    def _greedy_baselines(self, prompts: DataProto, gen_batch: DataProto) -> torch.Tensor:
        """ReMax (algorithm.adv_estimator=remax): the score of one greedy response per prompt, `(n_prompts,)`, the
        baseline its sampled responses are compared with."""
        greedy_input = gen_batch.select(batch_keys=GEN_BATCH_KEYS, non_tensor_batch_keys=list(gen_batch.non_tensor_batch))
        greedy_input.meta_info = {**gen_batch.meta_info, "do_sample": False}
        greedy = self._generate(greedy_input, 1)
        greedy.meta_info.pop("metrics", None)
        greedy = self._score_with_reward_model(prompts.repeat(1, interleave=True).union(greedy))
        reward_tensor, _, _ = run_reward(greedy, self.reward_fn)
        return reward_tensor.sum(dim=-1)

    def _collect_batch(self, prompt_batches, metrics: dict, timing: dict) -> DataProto | None:
        """Rollouts for one step as the batch filter keeps them, after the optional overlong filter and cut to a
        multiple of the number of ranks; None when the data ran out.

        The filter (`self.batch_filter`, see batch_filters.py) picks the prompts, keeps the groups of each generated
        sub-batch and says when the step has enough: Archer's trainer.rejection_sample keeps what one batch leaves,
        DAPO's algorithm.filter_groups and RLPR's algorithm.filter_mode=ema_std generate until data.train_batch_size
        groups are kept; no filter, one batch as it is.
        """
        batch_filter, gen_metrics, generated, batch = self.batch_filter, defaultdict(list), [], None
        batch_filter.begin_step(self.global_steps)
        while True:
            if self._stream is None:
                batch_dict = batch_filter.next_prompts(prompt_batches)
                scored = None if batch_dict is None else self._rollout_and_score(batch_dict, gen_metrics, timing)
            else:
                scored = self._streamed_rollout(prompt_batches, gen_metrics, timing)
            if scored is None:
                if batch is not None:
                    n, want = self.config.actor_rollout_ref.rollout.n, self.config.data.train_batch_size
                    print(f"[filter_groups] the data ran out at {len(batch) // n} of {want} groups; training on them")
                break
            new, extra_keys = scored
            generated.append(new)
            new = self._drop_stale_groups(new, gen_metrics)
            kept, _ = batch_filter.filter(new)
            batch = kept if batch is None else DataProto.concat([batch, kept])
            if not batch_filter.needs_more(len(batch)):
                break
        if batch is None:
            return None
        batch, filter_metrics = batch_filter.finish_step(batch)
        metrics.update(filter_metrics)
        metrics.update(reduce_metrics(gen_metrics))
        if self.config.trainer.rollout_data_dir:
            self._dump_rollouts(generated, extra_keys)
        return self._fit_to_ranks(batch, metrics)

    def _drop_stale_groups(self, batch: DataProto, gen_metrics: dict) -> DataProto:
        """The groups of `batch` within the plan's staleness bound for the coming update (all of them when nothing
        runs ahead); the dropped ones count in training/off_policy/dropped_groups, and filters that refill (DAPO,
        ema_std) draw more prompts for their place."""
        plan = self.plan.async_rl
        if not plan.overlaps or VERSIONS not in batch.batch:
            return batch
        staleness, _ = trajectory_staleness(batch.batch[VERSIONS], self.actor_version)
        over = groups_over_bound(batch.non_tensor_batch["uid"], staleness, plan.max_staleness)
        gen_metrics["training/off_policy/dropped_groups"].append(
            float(len(set(batch.non_tensor_batch["uid"][over].tolist()))))
        return batch.select_idxs(~over) if over.any() else batch

    def _dump_rollouts(self, generated: list[DataProto], extra_keys: list[str]) -> None:
        """Every rollout of the step, kept or filtered out, to `trainer.rollout_data_dir`."""
        all_generated = DataProto.concat(generated) if len(generated) > 1 else generated[0]
        extra = {key: all_generated.non_tensor_batch[key].tolist() for key in extra_keys}
        self._dump(self.config.trainer.rollout_data_dir, all_generated,
                   all_generated.batch["token_level_scores"].sum(-1).tolist(), extra)

    def _fit_to_ranks(self, batch: DataProto, metrics: dict) -> DataProto:
        """Archer's overlong filter (`trainer.enable_overlong_filter`), then the batch cut to a multiple of ranks."""
        if self.config.trainer.enable_overlong_filter:
            batch, stats = overlong_filter(batch, self.config.data.max_response_length)
            metrics["batch/overlong_dropped"] = stats["num_overlong"]
        batch, dropped = truncate_to_multiple(batch, self.n_ranks)
        metrics["batch/valid"] = len(batch)
        if dropped:
            metrics["batch/dropped_for_ranks"] = dropped
        return batch
