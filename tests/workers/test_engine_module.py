"""The HF engine's own copy of the actor (ActorRolloutRefWorker._load_engine_module)."""

from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.workers.fsdp_workers import ActorRolloutRefWorker


def test_the_engines_float32_copy_attends_with_sdpa_when_the_actor_selects_flash_attn():
    """flash-attn's kernels take no float32, and the engine keeps a float32 copy: the copy switches to sdpa (the
    actor's packed passes keep the varlen kernel)."""
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64))
    # What model.override_config.attn_implementation=flash_attention_2 gives where flash-attn is installed.
    model.config._attn_implementation = "flash_attention_2"
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker._load_hf_model = lambda: model
    assert worker._load_engine_module().config._attn_implementation == "sdpa"
