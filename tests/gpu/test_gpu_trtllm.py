"""The TensorRT-LLM engine (verl/workers/rollout/trtllm_rollout.py) on CUDA against the HF engine on the same weights:
its greedy tokens, its log-probs against the actor's at temperature 1 and below, and weights pushed as CUDA IPC
handles through the trainer's sleep / push / wake cycle. The model, the noise and the log-prob gap are those of
test_gpu_sglang.py. Skips where TensorRT-LLM is not installed."""

from __future__ import annotations

import importlib.util

import pytest
from test_gpu_kernels import LOGPROB_GAP_MEAN
from test_gpu_sglang import ROWS, TOKENS, _log_prob_gap, _model_dir, _perturb

pytestmark = pytest.mark.gpu


@pytest.mark.needs("cuda")
def test_trtllm_engine_matches_the_hf_engine_and_takes_pushed_weights(tmp_path, figures):
    if importlib.util.find_spec("tensorrt_llm") is None:
        pytest.skip("TensorRT-LLM is not installed: pip install tensorrt_llm --extra-index-url "
                    "https://pypi.nvidia.com to run the TensorRT-LLM engine's test")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout
    from verl.workers.rollout.trtllm_rollout import TRTLLMRollout

    model_dir = _model_dir(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to("cuda")
    _perturb(actor, seed=0)
    hf = HFRollout(actor, tokenizer, device="cuda", config={"static_decode": False})  # runs `actor` itself, float32
    config = {"prompt_length": 64, "response_length": TOKENS, "gpu_memory_utilization": 0.3}
    # weights_follow: load_format=dummy, so TensorRT-LLM has nothing but the pushed weights. Outside Ray, it starts
    # a Ray of its own whose one worker takes this machine's GPU: cuda:0, where the pushed tensors live.
    engine = TRTLLMRollout.build(model_path=model_dir, tokenizer=tokenizer, config=config, device="cuda:0", seed=0,
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
        # TensorRT-LLM runs bf16 (rollout.dtype), the HF engine float32: a near-tie may flip, rarely.
        figures["identical_greedy_rows"] = f"{same}/{ROWS}"
        assert same >= ROWS - ROWS // 4, "TensorRT-LLM's greedy tokens are not the actor's: did the push arrive?"

        for temperature in (1.0, 0.7):
            sampled = [group[0] for group in engine.generate(prompts, SamplingParams(temperature=temperature,
                                                                                     max_tokens=TOKENS))]
            gap = _log_prob_gap(actor, prompts, sampled, temperature)
            figures[f"logprob_gap_mean_T{temperature}"] = round(gap, 4)
            assert gap < LOGPROB_GAP_MEAN, f"TensorRT-LLM's log-probs at T={temperature} are not log softmax(z / T)"

        # The trainer's cycle: release while the actor trains, push the new weights, wake up, sample from them.
        engine.sleep()
        _perturb(actor, seed=2)
        engine.update_weights(actor.state_dict().items())
        engine.wake_up()
        assert engine.weights_checksum() == pytest.approx(hf.weights_checksum(), rel=1e-9)
        after = greedy_tokens(engine)
        assert after != before, "the pushed weights did not change TensorRT-LLM's greedy tokens"
        same = sum(a == b for a, b in zip(after, greedy_tokens(hf)))
        figures["identical_greedy_rows_after_push"] = f"{same}/{ROWS}"
        assert same >= ROWS - ROWS // 4
    finally:
        engine.llm.shutdown()
