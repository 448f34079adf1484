"""What the GPU tests of the served engines (SGLang, TensorRT-LLM) check in common: on one small model and the same
weights as the HF engine, the engine's greedy tokens, its log-probs against the actor's at temperature 1 and below,
and new weights pushed in memory through the trainer's sleep / push / wake cycle."""

from __future__ import annotations

import pytest
from test_gpu_kernels import LOGPROB_GAP_MEAN

ROWS, TOKENS = 16, 32
# The random init gives near-uniform next-token distributions, whose greedy near-ties bf16 rounding breaks at random;
# noise of this size spreads the logits over a few units, as a trained model's are.
NOISE = 0.2


def model_dir(path) -> str:
    """A 4-layer Qwen2 of head size 64 (a size the engines' attention kernels support) with the tiny tokenizer."""
    from verl.demo.tiny_model import build_tiny_model

    return build_tiny_model(str(path), seed=0, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                            intermediate_size=512)


def perturb(model, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator).to(param.device) * NOISE)


def actor_log_probs(model, prompt: list[int], completion: list[int], temperature: float):
    """The actor's log softmax(z / T) of `completion` after `prompt` (float32, on the CPU)."""
    import torch

    ids = torch.tensor([prompt + completion], device="cuda")
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, ids[0, len(prompt):, None])[:, 0].cpu()


def log_prob_gap(model, prompts, completions, temperature: float) -> float:
    """Mean |engine log-prob - actor log-prob| over every generated token."""
    import torch

    gaps = [(torch.tensor(c.log_probs) - actor_log_probs(model, p, c.token_ids, temperature)).abs()
            for p, c in zip(prompts, completions)]
    return float(torch.cat(gaps).mean())


def check_engine_against_hf(engine_cls, label: str, tmp_path, figures, shutdown, after_sleep=None) -> None:
    """Build `engine_cls` with placeholder weights (weights_follow: load_format=dummy), push the actor's, and check
    it against the HF engine running the actor itself; `after_sleep(engine)` checks what sleep released,
    `shutdown(engine)` stops it at the end. The engine runs bf16
    (rollout.dtype), the HF engine float32: a greedy near-tie may flip, rarely, so 3 rows in 4 must agree."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    directory = model_dir(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    actor = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to("cuda")
    perturb(actor, seed=0)
    hf = HFRollout(actor, tokenizer, device="cuda", config={"static_decode": False})  # runs `actor` itself, float32
    config = {"prompt_length": 64, "response_length": TOKENS, "gpu_memory_utilization": 0.3}
    engine = engine_cls.build(model_path=directory, tokenizer=tokenizer, config=config, device="cuda:0", seed=0,
                              load_module=None, weights_follow=True)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, len(tokenizer), (int(n),), generator=generator).tolist()
               for n in torch.randint(4, 24, (ROWS,), generator=generator)]
    greedy = SamplingParams(temperature=0.0, max_tokens=TOKENS)

    def greedy_tokens(rollout):
        return [group[0].token_ids for group in rollout.generate(prompts, greedy)]

    try:
        engine.update_weights(actor.state_dict().items())
        assert engine.weights_checksum() == pytest.approx(hf.weights_checksum(), rel=1e-9)
        before = greedy_tokens(engine)
        same = sum(a == b for a, b in zip(before, greedy_tokens(hf)))
        figures["identical_greedy_rows"] = f"{same}/{ROWS}"
        assert same >= ROWS - ROWS // 4, f"{label}'s greedy tokens are not the actor's: did the push arrive?"

        for temperature in (1.0, 0.7):
            sampled = [group[0] for group in engine.generate(prompts, SamplingParams(temperature=temperature,
                                                                                     max_tokens=TOKENS))]
            gap = log_prob_gap(actor, prompts, sampled, temperature)
            figures[f"logprob_gap_mean_T{temperature}"] = round(gap, 4)
            assert gap < LOGPROB_GAP_MEAN, f"{label}'s log-probs at T={temperature} are not log softmax(z / T)"

        # The trainer's cycle: release while the actor trains, push the new weights, wake up, sample from them.
        engine.sleep()
        if after_sleep is not None:
            after_sleep(engine)
        perturb(actor, seed=2)
        engine.update_weights(actor.state_dict().items())
        engine.wake_up()
        assert engine.weights_checksum() == pytest.approx(hf.weights_checksum(), rel=1e-9)
        after = greedy_tokens(engine)
        assert after != before, f"the pushed weights did not change {label}'s greedy tokens"
        same = sum(a == b for a, b in zip(after, greedy_tokens(hf)))
        figures["identical_greedy_rows_after_push"] = f"{same}/{ROWS}"
        assert same >= ROWS - ROWS // 4
    finally:
        shutdown(engine)
