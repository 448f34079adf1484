"""The TensorRT-LLM engine (verl/workers/rollout/trtllm_rollout.py) on CUDA against the HF engine on the same weights
(served_engines.check_engine_against_hf): greedy tokens, log-probs against the actor's, and weights pushed as CUDA IPC
handles through the trainer's sleep / push / wake cycle. Outside Ray, TensorRT-LLM starts a Ray of its own whose one
worker takes this machine's GPU: cuda:0, where the pushed tensors live. Skips where TensorRT-LLM is not installed."""

from __future__ import annotations

import importlib.util

import pytest
from served_engines import check_engine_against_hf

pytestmark = pytest.mark.gpu


@pytest.mark.needs("cuda")
def test_trtllm_engine_matches_the_hf_engine_and_takes_pushed_weights(tmp_path, figures):
    if importlib.util.find_spec("tensorrt_llm") is None:
        pytest.skip("TensorRT-LLM is not installed: pip install tensorrt_llm --extra-index-url "
                    "https://pypi.nvidia.com to run the TensorRT-LLM engine's test")
    from verl.workers.rollout.trtllm_rollout import TRTLLMRollout

    check_engine_against_hf(TRTLLMRollout, "TensorRT-LLM", tmp_path, figures, shutdown=lambda e: e.llm.shutdown())
