r"""RLPR's probability reward manager (`reward_model.reward_manager=prob`): no verifier, the policy scores itself.

For every response the reference answer y* is spliced in place of the model's answer (`rlpr/splice.py` beside this
file), the current actor scores the spliced sequences in a no-grad forward at the rollout temperature (the trainer
attaches its log-prob pass with `attach_log_prob_fn`; it is batched like the old-log-prob pass), and

    scoreB = agg(p(y* tokens))                         reward_model.compute_score_name
    d      = bin(f(scoreB - scoreA))                   reward_model.reward_manager_shaping_function_name, ..._discrete_
    R      = (1 - alpha) d + alpha F  (+ repetition)   reward_model.format_coefficient, format_mode, repetition_penalty

(`rlpr/scoring.py`). scoreA (the debiasing term, the reference answer's probability without reasoning) comes from a
`scoreA` column or `reward_model.scoreA` when `reward_model.use_debiasing`, else from the table that
`prepare_with_actor` computes once with the initial weights when `reward_model.compute_scoreA_online`; a sample
without one is an error that names it. A non-finite reward scores 0 with status non_finite (reward_manager/isolation.py).
Per-row columns: scoreB, scoreA, format, valid, reward_status. Metrics: rlpr/scoreB_mean, rlpr/valid_fraction,
rlpr/format_fraction, reward/status/*, reward/failed_fraction.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.config import option
from verl.workers.reward_manager.isolation import status_metrics
from verl.workers.reward_manager.naive import NaiveRewardManager, last_valid_position
from verl.workers.reward_manager.registry import register_reward_manager
from verl.workers.reward_manager.rlpr.score_a import score_a_key, score_a_table
from verl.workers.reward_manager.rlpr.scoring import (
    aggregate,
    discretize,
    final_reward,
    format_reward,
    repetition_penalty,
    shaping_function,
)
from verl.workers.reward_manager.rlpr.splice import build_pr_batch, splice_reference, tokenize_spliced

__all__ = ["ProbRewardManager", "score_a_key", "strip_padding"]


def strip_padding(text: str, pad: str | None) -> str:
    if pad:
        while text.startswith(pad):
            text = text[len(pad) :]
        while text.endswith(pad):
            text = text[: -len(pad)]
    return text


@register_reward_manager("prob")
class ProbRewardManager(NaiveRewardManager):
    """RLPR's reward (module docstring); its options are the `reward_model` keys of the same names."""

    reward_model_keys = ("format_mode", "compute_score_name", "reward_manager_shaping_function_name",
                         "reward_manager_discrete_function_name", "format_coefficient", "repetition_penalty",
                         "repetition_penalty_max_repetitions_limit", "use_debiasing",
                         "allow_empty_leading_whitespaces", "gt_tokens_one_more", "gt_tokens_one_more_adjusted",
                         "compute_scoreA_online")

    @classmethod
    def config_kwargs(cls, config: Any) -> dict[str, Any]:
        """The `reward_model_keys` entries plus `max_prompt_length` (data.max_prompt_length)."""
        kwargs = super().config_kwargs(config)
        max_prompt_length = (config.get("data") or {}).get("max_prompt_length")
        if max_prompt_length is not None:
            kwargs["max_prompt_length"] = max_prompt_length
        return kwargs

    def __init__(self, tokenizer: Any, num_examine: int, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source", max_prompt_length: int | None = None,
                 max_resp_len: int | None = None, **kwargs: Any):
        """Options: the `reward_model_keys`, each defaulting to its `reward_model.<key>` in ppo_trainer.yaml (as
        `max_prompt_length` to data.max_prompt_length); other keywords go to NaiveRewardManager."""
        opts = {key: option(kwargs, key, "reward_model") for key in self.reward_model_keys}
        for key in self.reward_model_keys:
            kwargs.pop(key, None)
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, max_resp_len=max_resp_len, **kwargs)
        self.format_mode, self.aggregation = opts["format_mode"], opts["compute_score_name"]
        self.shape = shaping_function(opts["reward_manager_shaping_function_name"])
        self.bin = discretize(opts["reward_manager_discrete_function_name"])
        self.format_coefficient, self.use_debiasing = opts["format_coefficient"], opts["use_debiasing"]
        self.repetition = opts["repetition_penalty"]
        self.max_repetitions = opts["repetition_penalty_max_repetitions_limit"]
        self.max_prompt_length = option({"max_prompt_length": max_prompt_length}, "max_prompt_length", "data")
        self.max_response_length = max_resp_len
        aggregate(torch.zeros(1, 1), torch.zeros(1, 1), self.aggregation)  # a wrong name fails at start-up
        self.log_prob_fn: Callable[[DataProto], torch.Tensor] | None = None
        self.splice_options = {key: opts[key] for key in ("allow_empty_leading_whitespaces", "gt_tokens_one_more")}
        self.one_more_cap = opts["gt_tokens_one_more_adjusted"]  # cap the extra token's log-prob at log 0.5
        self.compute_score_a_online = opts["compute_scoreA_online"]
        self.score_a_table: dict[str, float] | None = None  # filled by prepare_with_actor

    # ------------------------------------------------------------------------------------------------ trainer hooks
    def attach_log_prob_fn(self, fn: Callable[[DataProto], torch.Tensor]) -> None:
        """`fn(batch) -> (bs, response_len)` log-probs of `batch["responses"]` under the current actor.

        The trainer calls this on any reward manager that has it, once its workers are up."""
        self.log_prob_fn = fn

    def prepare_with_actor(self, log_prob_fn: Callable[[DataProto], torch.Tensor], dataset, run_dir: str) -> None:
        """One-off work with the initial actor before training: the trainer calls this on any reward manager that has
        it, at the start of `fit()`, before a checkpoint replaces the initial weights.

        `log_prob_fn` is the actor's log-prob pass (as in `attach_log_prob_fn`), `dataset` the training set and
        `run_dir` the run's directory (`trainer.default_local_dir`). With `reward_model.compute_scoreA_online` this
        computes scoreA of every training prompt (`rlpr.score_a.score_a_table`) and keeps it in
        `<run_dir>/scoreA.json`; a resumed run, finding the file, reads it instead of recomputing.
        """
        if not self.compute_score_a_online:
            return
        path = os.path.join(run_dir, "scoreA.json")
        if os.path.exists(path):
            with open(path) as f:
                self.score_a_table = json.load(f)
            print(f"[rlpr] scoreA of {len(self.score_a_table)} prompts read from {path}")
            return
        if self.max_response_length is None:
            raise ValueError("reward_model.compute_scoreA_online=true needs data.max_response_length (max_resp_len)")
        self.score_a_table = score_a_table(dataset, self.tokenizer, log_prob_fn, self.aggregation,
                                           self.max_prompt_length, self.max_response_length)
        os.makedirs(run_dir, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(self.score_a_table, f)
        os.replace(path + ".tmp", path)
        print(f"[rlpr] scoreA of {len(self.score_a_table)} prompts computed with the initial weights ({path})")

    # ------------------------------------------------------------------------------------------------ scoring
    def _texts(self, data: DataProto) -> tuple[list[str], list[str]]:
        """Prompts and responses decoded with special tokens, padding removed, the response ending in EOS."""
        pad, eos = self.tokenizer.pad_token, self.tokenizer.eos_token
        prompt_len = data.batch["prompts"].shape[-1]
        attention = data.batch["attention_mask"].bool()
        prompts, responses = [], []
        for ids, mask in zip(data.batch["input_ids"], attention):
            prompts.append(self.tokenizer.decode(ids[:prompt_len][mask[:prompt_len]].tolist()))
            response = strip_padding(self.tokenizer.decode(ids[prompt_len:][mask[prompt_len:]].tolist()), pad)
            responses.append(response)
        return prompts, [r if r.endswith(eos) else r + eos for r in responses]

    def _score_a(self, data: DataProto, prompts: list[str] | None = None) -> np.ndarray:
        if not self.use_debiasing:
            return np.zeros(len(data))
        column = data.non_tensor_batch.get("scoreA")
        values = []
        for i, reward_model in enumerate(data.non_tensor_batch["reward_model"]):
            value = column[i] if column is not None else (reward_model or {}).get("scoreA")
            if value is None and self.score_a_table is not None and prompts is not None:
                value = self.score_a_table.get(score_a_key(prompts[i], str(reward_model["ground_truth"])))
            if value is None or not np.isfinite(float(value)):
                index = (data.non_tensor_batch.get("extra_info", [None] * len(data))[i] or {}).get("index", i)
                raise ValueError(f"sample {index} (row {i}) has no scoreA, and reward_model.use_debiasing=true; run "
                                 "tools/compute_scoreA.py on the training file, set reward_model."
                                 "compute_scoreA_online=true, or set use_debiasing=false")
            values.append(float(value))
        return np.asarray(values)

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        if self.log_prob_fn is None:
            raise RuntimeError("reward_model.reward_manager=prob needs the actor's log-prob pass: the trainer attaches "
                               "it (attach_log_prob_fn); offline scoring of responses is not possible with it")
        prompts, responses = self._texts(data)
        truths = [str(rm["ground_truth"]) for rm in data.non_tensor_batch["reward_model"]]
        response_len = self.max_response_length or data.batch["responses"].shape[-1]
        one_more = self.splice_options["gt_tokens_one_more"]
        rows = [tokenize_spliced(splice_reference(p, r, y, self.tokenizer.eos_token, self.format_mode,
                                                  **self.splice_options),
                                 self.tokenizer, self.max_prompt_length + response_len, response_len, one_more)
                for p, r, y in zip(prompts, responses, truths)]
        tensors = build_pr_batch(rows, self.tokenizer.pad_token_id, self.max_prompt_length + response_len,
                                 response_len)
        answer_mask = tensors.pop("answer_mask")
        pr_batch = DataProto.from_dict(tensors=tensors, meta_info=dict(data.meta_info))
        log_probs = self.log_prob_fn(pr_batch).cpu()
        if self.one_more_cap:  # the token after y* (marked 2) counts at most log 0.5
            log_probs = torch.where(answer_mask == 2, log_probs.clamp(max=math.log(0.5)), log_probs)
        score_b = aggregate(log_probs, (answer_mask > 0).long(), self.aggregation).numpy()
        score_a = self._score_a(data, prompts)

        plain = [strip_padding(r, self.tokenizer.eos_token) for r in responses]
        formats = [format_reward(r, self.format_mode) for r in plain]
        rewards = []
        for b, a, f, text in zip(score_b, score_a, formats, plain):
            reward = final_reward(self.bin(self.shape(float(b) - float(a))), f, self.format_coefficient)
            rewards.append(repetition_penalty(reward, text, self.max_repetitions) if self.repetition else reward)

        # A non-finite reward (the actor's log-probs went NaN) is a failed sample: 0, status non_finite.
        checked, statuses = self.checker.check(rewards, data.non_tensor_batch[self.reward_fn_key].tolist(),
                                               "RLPR's probability reward (reward_model.reward_manager=prob)")
        response_mask = data.batch["attention_mask"][:, data.batch["prompts"].shape[-1] :]
        reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        reward_tensor[torch.arange(len(data)), last_valid_position(response_mask)] = torch.tensor(
            [row["score"] for row in checked])
        valid = [float(row["valid"]) for row in rows]
        extra = {"scoreB": score_b.tolist(), "scoreA": score_a.tolist(), "format": formats, "valid": valid,
                 "reward_status": statuses}
        metrics = {"rlpr/scoreB_mean": float(np.mean(score_b)), "rlpr/valid_fraction": float(np.mean(valid)),
                   "rlpr/format_fraction": float(np.mean(formats)), **status_metrics(statuses)}
        if not return_dict:
            return reward_tensor
        return {"reward_tensor": reward_tensor, "reward_extra_info": extra, "reward_metrics": metrics}
