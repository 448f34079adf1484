"""The small Qwen2 model, prompts and helpers that exact mode's tests share (tests/utils/test_exact_kernels.py,
tests/utils/exact_triton_checks.py, tests/workers/rollout/test_graphed_step.py, tests/gpu/test_gpu_exact.py): a
rollout batch from an engine, and the actor's log-probs of it. Tests import them as `from exact_models import ...`
(pytest puts tests/ on sys.path through its conftest)."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.protocol import DataProto
from verl.utils.torch_functional import compute_position_id_with_mask, pad_2d_list_to_tensor
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.rollout.layout import generate_sequences

PROMPTS = [[5, 9, 3], [17, 2], [40, 41, 42, 43, 44, 45], [7] * 11, [30, 31, 32, 33]]


class Tokenizer:
    pad_token_id = 0
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


def model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128)
    return Qwen2ForCausalLM(config).eval()


def rollout_batch(engine, prompts, params, response_length=12, stop_ids=(95,)):
    ids = pad_2d_list_to_tensor(prompts, 0, left=True)
    mask = pad_2d_list_to_tensor([[1] * len(p) for p in prompts], 0, left=True)
    batch = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask,
                                         "position_ids": compute_position_id_with_mask(mask)},
                                non_tensors={"raw_prompt_ids": prompts})
    return generate_sequences(engine, batch, params, response_length, 0, list(stop_ids))


def actor_log_probs(actor_model, batch, packed, temperature, fused=False):
    """The actor's log-probs of `batch` on the model's device, returned on the CPU."""
    cfg = OmegaConf.create({"ppo_epochs": 1, "optim": {"clip_grad": 1.0}, "policy_loss": {}})
    batch.meta_info["temperature"] = temperature
    actor = DataParallelPPOActor(cfg, actor_model, use_remove_padding=packed, fused_logprobs=fused)
    log_probs, _ = actor.compute_log_prob(batch.to(next(actor_model.parameters()).device))
    return log_probs.cpu()
