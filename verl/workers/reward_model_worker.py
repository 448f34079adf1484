"""RewardModelWorker: one rank of a reward model, a frozen FSDP2-sharded `AutoModelForSequenceClassification` with
one label.

The driver calls `compute_rm_score` through a RayWorkerGroup (DP_COMPUTE_PROTO: each rank scores its share of the
batch) and unions the returned `rm_scores` into the batch before the reward manager runs; the manager then returns
them as the reward (verl's behaviour; verl/workers/reward_manager/naive.py says how a custom_reward_function sees
them).

What the reward model reads, per row: the policy's own tokens (prompt + response under the attention mask) when it
shares the policy's tokenizer, else the conversation re-written in its own chat template (`retemplate`). Its score is
its output on the last token it reads, put on the response's last valid token.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os

import torch
from omegaconf import DictConfig
from tensordict import TensorDict

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.fsdp_utils import fsdp_mesh, reshard_all, shard_model
from verl.utils.import_utils import import_external_libs
from verl.utils.packing import pack_rows, uses_varlen_attention
from verl.utils.run_plan import RunPlan
from verl.utils.seqlen_balancing import restore_order, split_micro_batches
from verl.utils.torch_functional import pad_2d_list_to_tensor
from verl.workers.reward_manager.naive import last_valid_position

logger = logging.getLogger(__name__)


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers turn a conversation into the same ids: same vocabulary and same chat template."""
    return a.get_vocab() == b.get_vocab() and a.chat_template == b.chat_template


def retemplate(messages: list[dict], response: str, tokenizer) -> list[int]:
    """The ids of the conversation `messages` + the assistant's `response` in `tokenizer`'s chat template (the
    template writes any special tokens the model expects, so none are added on top)."""
    chat = [*messages, {"role": "assistant", "content": response}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@contextlib.contextmanager
def token_scores(head: torch.nn.Module):
    """Within the block, the returned dict's "scores" holds the head's output at every position of the last forward,
    `(batch, seq_len)`. HF's sequence classifiers return only the one at the last token that is not the pad token,
    which is the wrong one when a sequence ends in a token equal to the pad token (an EOS used as padding)."""
    out = {}

    def keep(module, args, output):
        out["scores"] = output[..., 0]

    handle = head.register_forward_hook(keep)
    try:
        yield out
    finally:
        handle.remove()


class RewardModelWorker(Worker):
    """Holds one rank of the reward model. `config` is the `reward_model` node of the trainer config; `plan` the run's
    plan (verl/trainer/ppo/run_plan.py: the device and this rank's micro-batches)."""

    def __init__(self, config: DictConfig, plan: RunPlan, plugins: list[str] | None = None):
        super().__init__()
        self.config = copy.deepcopy(config)
        self.plan = plan
        self.device = device = plan.device
        import_external_libs(config.model.get("external_lib"), key="reward_model.model.external_lib")
        import_external_libs(plugins, key="trainer.plugins")
        self.init_process_group(device)
        if device == "cuda":
            # Ray shows each actor only its own GPU, so local ranks map onto the visible devices.
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
        self.micro = plan.reward_model.forward
        self.shard_group = plan.reward_model.fsdp_size
        self._warned_no_raw_prompt = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self):
        """Load the reward model and its tokenizer (and the policy's, when the two differ) and shard it with FSDP2.
        Not blocking: the driver gets a future, so the reward model loads while the actor does."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model_cfg = self.config.model
        path = os.path.expanduser(model_cfg.path)
        self._torch_device = self.batch_device
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
        self.input_tokenizer = None  # set when the RM cannot read the policy's tokens
        if model_cfg.get("input_tokenizer"):
            policy = AutoTokenizer.from_pretrained(os.path.expanduser(model_cfg.input_tokenizer),
                                                   trust_remote_code=model_cfg.trust_remote_code)
            if not same_tokenizer(policy, self.tokenizer):
                self.input_tokenizer = policy
        if self.input_tokenizer is not None and not self.tokenizer.chat_template:
            raise ValueError(f"reward_model.model.path={model_cfg.path}: its tokenizer differs from the policy's "
                             f"(reward_model.model.input_tokenizer={model_cfg.input_tokenizer}) and has no chat "
                             "template to write the conversation in")
        self.pad_token_id = next((t for t in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id)
                                  if t is not None), 0)
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=torch.float32, trust_remote_code=model_cfg.trust_remote_code)
        head = getattr(model, "score", None)
        if not isinstance(head, torch.nn.Module):
            raise ValueError(f"reward_model.model.path={model_cfg.path}: {type(model).__name__} has no `score` head; "
                             "the reward model must be a decoder-only AutoModelForSequenceClassification "
                             "(e.g. Qwen2ForSequenceClassification, LlamaForSequenceClassification)")
        if model.config.pad_token_id is None:  # HF refuses batches of more than one row without it
            model.config.pad_token_id = self.pad_token_id
        self.vocab_rows = model.get_input_embeddings().num_embeddings
        model.requires_grad_(False)
        model.eval()
        mesh = fsdp_mesh(self.device, self.world_size, self.shard_group)
        self.module = shard_model(model.to(self._torch_device), mesh, self.device, model_cfg.fsdp_config)
        self.score_head = head
        # use_remove_padding: one packed row under a varlen attention kernel, else rows no wider than the batch's.
        self.varlen_attention = uses_varlen_attention(model.config)

    # ------------------------------------------------------------------------------------------------ inputs
    def _messages(self, data: DataProto, i: int, prompt_ids: torch.Tensor) -> list[dict]:
        """Row i's prompt as chat messages: the dataset's (data.return_raw_chat=true), else its decoded text as one
        user message (the policy's template markup, special tokens aside, stays in that text)."""
        raw = data.non_tensor_batch.get("raw_prompt")
        if raw is not None:
            return list(raw[i])
        if not self._warned_no_raw_prompt:
            logger.warning("reward model: the batch has no raw_prompt (set data.return_raw_chat=true); each prompt "
                           "is given to the reward model's chat template as its decoded text, one user message")
            self._warned_no_raw_prompt = True
        return [{"role": "user", "content": self.input_tokenizer.decode(prompt_ids.tolist(),
                                                                        skip_special_tokens=True)}]

    def _rm_inputs(self, data: DataProto) -> tuple[list[list[int]], int]:
        """One id list per row, what the reward model reads, at most `max_length` long (a longer one loses its first
        tokens: the start of the prompt); returns the lists and how many were cut."""
        # On the host: the loop reads them row by row (each read of a GPU tensor would be a sync).
        input_ids, attention_mask = data.batch["input_ids"].cpu(), data.batch["attention_mask"].bool().cpu()
        prompt_len = data.batch["prompts"].shape[-1]
        max_length = self.config.max_length or input_ids.shape[-1]
        rows = []
        for i in range(len(data)):
            ids = input_ids[i][attention_mask[i]].tolist()
            if self.input_tokenizer is not None:
                prompt = input_ids[i, :prompt_len][attention_mask[i, :prompt_len]]
                response = input_ids[i, prompt_len:][attention_mask[i, prompt_len:]]
                text = self.input_tokenizer.decode(response.tolist(), skip_special_tokens=True)
                ids = retemplate(self._messages(data, i, prompt), text, self.tokenizer)
            elif ids and max(ids) >= self.vocab_rows:
                raise ValueError(f"token id {max(ids)} of the policy's batch is outside the reward model's "
                                 f"{self.vocab_rows}-token vocabulary: set reward_model.model.input_tokenizer to the "
                                 "policy's tokenizer so that the text is re-tokenized for the reward model")
            rows.append(ids)
        truncated = sum(len(ids) > max_length for ids in rows)
        return [ids[-max_length:] for ids in rows], truncated

    # --------------------------------------------------------------------------------------------- scoring
    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`(bs,)` outputs on the last token of right-padded rows `(bs, width)` of `lengths` tokens each; with
        the plan's padding removal (reward_model.model.use_remove_padding) the real tokens go through the model packed into rows (verl/utils/packing.py)."""
        position_ids = torch.clamp(attention_mask.cumsum(-1) - 1, min=0)
        rows = torch.arange(len(lengths), device=input_ids.device)
        if not self.plan.reward_model.remove_padding:
            with token_scores(self.score_head) as out:
                self.module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
            return out["scores"][rows, lengths - 1]
        packed_ids, packed_positions, destination = pack_rows(input_ids, attention_mask, position_ids,
                                                              self.pad_token_id, self.varlen_attention)
        with token_scores(self.score_head) as out:
            self.module(input_ids=packed_ids, position_ids=packed_positions, attention_mask=None, use_cache=False)
        return out["scores"].flatten()[destination[rows, lengths - 1]]

    @torch.no_grad()
    def _scores(self, rows: list[list[int]]) -> torch.Tensor:
        """`(len(rows),)` float32 scores: the model's output on each row's last token, in the planned micro-batches
        (`reward_model.micro_batch_size_per_gpu` rows or, with use_dynamic_bsz, at most forward_max_token_len_per_gpu
        tokens). The rows are built here, on the rank's device."""
        lengths = torch.tensor([len(ids) for ids in rows])
        input_ids = pad_2d_list_to_tensor(rows, self.pad_token_id)  # right padding: row b ends at lengths[b] - 1
        attention_mask = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long()
        batch = TensorDict({"input_ids": input_ids, "attention_mask": attention_mask, "length": lengths},
                           batch_size=[len(rows)], device=self._torch_device)
        size, max_token_len = (self.micro.size, self.micro.max_token_len) if self.micro else (None, None)
        micro_batches, index_map = split_micro_batches(batch, size, max_token_len)
        scores = []
        for micro in micro_batches:
            width = int(micro["length"].max())  # the columns after it are padding in every row
            scores.append(self._forward(micro["input_ids"][:, :width], micro["attention_mask"][:, :width],
                                        micro["length"]).float())
        reshard_all(self.module)  # with reshard_after_forward=false, no backward pass would free them
        return restore_order(torch.cat(scores), index_map)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores` `(bs, response_len)`: each row's reward-model score on its response's last valid token (the
        first position for an empty response), 0 elsewhere. Reads `input_ids`, `attention_mask`, `prompts` and,
        when re-templating, the non-tensor `raw_prompt`. meta_info["metrics"]: the fraction of rows cut to
        reward_model.max_length."""
        rows, truncated = self._rm_inputs(data)
        scores = self._scores(rows)
        prompt_len = data.batch["prompts"].shape[-1]
        response_mask = data.batch["attention_mask"][:, prompt_len:]
        rm_scores = torch.zeros(response_mask.shape, dtype=torch.float32, device=scores.device)
        rm_scores[torch.arange(len(data), device=scores.device), last_valid_position(response_mask)] = scores
        return DataProto.from_dict(tensors={"rm_scores": rm_scores},
                                   meta_info={"metrics": {"reward_model/truncated_fraction": [truncated / len(data)]}})
