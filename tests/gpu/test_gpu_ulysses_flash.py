"""verl/utils/ulysses.py on CUDA with flash-attn: Ulysses SP=2 attends with flash-attn's varlen kernel over the whole
rows' cu_seqlens (`SequenceLayout`), and gives the log-probs, entropies and gradients of the plain SP=1 forward.

Two gloo ranks share the one GPU (gloo takes CUDA tensors through the host, so no second GPU is needed) and run a
Qwen2 of 2 layers, hidden 256, 4 query heads over 2 kv heads, in bfloat16 with attn_implementation=flash_attention_2,
on one packed row of sequences of different lengths, as the actor packs a micro-batch under a varlen kernel
(`verl/utils/packing.pack_rows`). The plain forward is the same model on the same row, where transformers reads the
sequences from the packed position ids and runs the same varlen kernel. Both are bfloat16: they differ by the
matrix products' rounding over S/2 rows against S, so the bounds are bfloat16's, not float32's.
"""

from __future__ import annotations

import os
import traceback

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import leave_group, run_ranks_to_files

pytestmark = pytest.mark.gpu

LENGTHS = [300, 1, 517, 129, 77]  # 1,024 tokens: each rank's piece ends inside the 517-token sequence
LOG_PROB_MAX_DIFF = 0.05  # bfloat16 log-probs of a 97-token vocabulary, SP=2 against SP=1
GRADIENT_RELATIVE_ERROR = 0.05  # of each parameter's gradient, relative to its largest entry
DEADLINE_S = 300


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=97, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         attn_implementation="flash_attention_2")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)


def _batch():
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None].cuda()
    ids = torch.randint(1, 97, positions.shape, generator=torch.Generator().manual_seed(1)).cuda()
    scored = torch.ones_like(positions)
    scored[0, torch.tensor(LENGTHS).cumsum(0) - 1] = 0  # each sequence's last token predicts nothing of its own
    return ids, positions, scored


def _stats(logits, labels):
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    logits = logits.float()
    return logprobs_from_logits(logits, labels), entropy_from_logits(logits)


def _rank_main(rank: int, port: int, out_dir: str):
    from verl.utils.torch_functional import masked_mean
    from verl.utils.ulysses import ulysses_forward

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    group = dist.group.WORLD
    result = {}
    try:
        ids, positions, scored = _batch()
        labels = ids.roll(-1, dims=1)
        model = _model()
        plain = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        plain_log_probs, plain_entropy = _stats(plain, labels)
        masked_mean(plain_log_probs, scored).backward()
        expected = {name: param.grad.float().clone() for name, param in model.named_parameters()}
        model.zero_grad()
        with ulysses_forward(model, group, ids, None, positions) as sp:
            log_probs, entropy = _stats(model(**sp.model_inputs, use_cache=False).logits, sp.split(labels))
            log_probs, entropy = sp.gather(log_probs), sp.gather(entropy)
        masked_mean(log_probs, scored).backward()
        worst = 0.0
        for name, param in model.named_parameters():
            grad = param.grad.float()
            dist.all_reduce(grad, group=group)  # FSDP's average over the group, by hand
            grad /= 2
            scale = expected[name].abs().max().clamp(min=1e-12)
            worst = max(worst, float((grad - expected[name]).abs().max() / scale))
        result = {"implementation": model.config._attn_implementation,
                  "varlen_sequences": len(sp.model_inputs["ulysses"].layout.lengths),
                  "log_prob": float((log_probs - plain_log_probs).detach().abs().max()),
                  "entropy": float((entropy - plain_entropy).detach().abs().max()),
                  "gradient": worst}
    except Exception:
        result = {"error": traceback.format_exc()}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_group()


@pytest.mark.needs("cuda", "flash_attn")
def test_ulysses_flash_attention_varlen_matches_sp1(tmp_path, figures):
    results = run_ranks_to_files(_rank_main, tmp_path, DEADLINE_S)
    for result in results:
        assert "error" not in result, result["error"]
        # The packed row's 5 sequences and the split's end padding (none: 1,024 splits evenly).
        assert result["implementation"] == "ulysses_flash_attention_2" and result["varlen_sequences"] == 5, result
        assert result["log_prob"] < LOG_PROB_MAX_DIFF and result["entropy"] < LOG_PROB_MAX_DIFF, result
        assert result["gradient"] < GRADIENT_RELATIVE_ERROR, result
    figures.update({f"ulysses_flash_{key}": results[0][key] for key in ("log_prob", "entropy", "gradient")})
