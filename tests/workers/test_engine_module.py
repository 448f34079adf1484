"""The HF engine's own copy of the actor (ActorRolloutRefWorker._load_engine_module)."""

from types import SimpleNamespace

import pytest
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.workers.fsdp_workers import ActorRolloutRefWorker


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_engines_copy_loads_in_the_plans_dtype_and_attends_with_sdpa_when_the_actor_selects_flash_attn(dtype):
    """The copy is loaded in the run plan's hf_engine_dtype (float32 on CPU, rollout.dtype on CUDA). flash-attn's
    kernels take no float32, and the static loop's padded cache needs a mask: the copy switches to sdpa (the actor's
    packed passes keep the varlen kernel)."""
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64))
    # What model.override_config.attn_implementation=flash_attention_2 gives where flash-attn is installed.
    model.config._attn_implementation = "flash_attention_2"
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.plan = SimpleNamespace(rollout=SimpleNamespace(hf_engine_dtype=dtype, exact=False))
    loaded = []
    worker._load_hf_model = lambda dtype: loaded.append(dtype) or model
    assert worker._load_engine_module().config._attn_implementation == "sdpa"
    assert loaded == [dtype]
