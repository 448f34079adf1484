"""verl 0.9.1 keys that change what a run computes (verl/utils/verl_keys.py): refused at such values before any
worker starts, accepted (and announced) at values Quiver computes the same for; verl 0.9's LoRA section and SAPO's
actor-level temperatures set Quiver's keys."""

import pytest

from verl.trainer.config import load_config
from verl.utils.config import ConfigError
from verl.utils.verl_keys import exclude_regex, hf_target_modules

M = "actor_rollout_ref.model"


@pytest.mark.parametrize("override, capability", [
    ("actor_rollout_ref.actor.optim.optimizer=Muon", "the optimizer is torch's AdamW"),
    ("critic.optim.optimizer_impl=bitsandbytes.optim", "the optimizer is torch's AdamW"),
    ("actor_rollout_ref.actor.fsdp_config.qat.enable=true", "quantization-aware training"),
    (f"{M}.mtp.enable=true", "multi-token prediction"),
    (f"{M}.custom_chat_template='{{{{ messages }}}}'", "chat template given in the config is not applied"),
    ("actor_rollout_ref.rollout.logprobs_mode=raw_logprobs", "not raw ones"),
    ("actor_rollout_ref.rollout.quantization=fp8", "unquantized"),
    ("reward.reward_manager.source=importlib", "register yours with @register"),
    ("skip.async_rollout.enable=true", "synchronous trainer only"),
    (f"{M}.lora.type=dora", "no DoRA"),
    (f"{M}.lora.dropout=0.05", "without adapter dropout"),
    ("actor_rollout_ref.actor.fsdp_config.router_replay.mode=R2", "MoE routing replay"),
    ("actor_rollout_ref.rollout.enable_rollout_routing_replay=true", "MoE routing replay"),
])
def test_a_value_asking_for_what_quiver_lacks_is_refused_naming_key_and_capability(override, capability):
    key = override.split("=", 1)[0]
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    line = next(line for line in str(err.value).splitlines() if key in line)
    assert capability in line


@pytest.mark.parametrize("override", [
    "actor_rollout_ref.actor.optim.optimizer=AdamW", "actor_rollout_ref.rollout.over_sample_rate=0",
    "actor_rollout_ref.rollout.over_sample_rate=0.1",  # verl's multi-turn scripts: every response generated whole
    "actor_rollout_ref.rollout.logprobs_mode=processed_logprobs",
    f"{M}.mtp.enable=false", "actor_rollout_ref.rollout.quantization=null", "skip.rollout_tq.enable=false",
    "actor_rollout_ref.actor.fsdp_config.full_determinism=true",  # a kernel switch: announced, not refused
    f"{M}.lora.type=canonical_lora",  # an adapter per q, k, v: what peft's LoRA is on a HF model
])
def test_the_same_computation_is_accepted(override, capsys):
    from verl.trainer.ppo.config_rules import announce_inert_keys

    cfg = load_config(overrides=[override])
    assert override.split("=", 1)[0] in announce_inert_keys(cfg, "hf")


def test_several_refusals_are_listed_together():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{M}.mtp.enable=true", "actor_rollout_ref.rollout.quantization=fp8"])
    assert f"{M}.mtp.enable=True" in str(err.value) and "quantization='fp8'" in str(err.value)


def test_verls_lora_section_sets_quivers_lora_keys_with_the_layers_an_fsdp_user_means(capsys):
    from verl.trainer.ppo.config_rules import announce_inert_keys

    cfg = load_config(overrides=[f"{M}.lora.rank=16", f"{M}.lora.merge=true"])
    model = cfg.actor_rollout_ref.model
    # verl's section default alpha (32), and its Megatron default modules: every linear layer of the decoder
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (16, 32.0, "all-linear")
    assert "rank" not in model.lora and model.lora.merge is True  # merge: announced (the engine gets merged weights)
    assert f"{M}.lora.merge" in announce_inert_keys(cfg, "hf") and f"{M}.lora.rank" not in announce_inert_keys(cfg, "hf")
    cfg = load_config(overrides=[f"{M}.lora.rank=8", f"{M}.lora.alpha=8", "+" + f"{M}.lora.target_modules=[linear_qkv]",
                                 f"{M}.lora.exclude_modules=[lm_head,mlp]", f"{M}.lora.adapter_path=null"])
    model = cfg.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (8, 8, "q_proj,k_proj,v_proj")
    assert model.exclude_modules == r"(.*\.)?(lm_head|mlp)" and model.lora_adapter_path is None and "lora" not in model
    # the older spelling alone, and both spellings agreeing, work; disagreeing is an error naming both keys
    assert load_config(overrides=[f"{M}.lora_rank=4", f"{M}.lora.rank=4"]).actor_rollout_ref.model.lora_rank == 4
    assert load_config(overrides=[f"{M}.lora_alpha=64", f"{M}.lora.rank=4"]).actor_rollout_ref.model.lora_alpha == 64
    with pytest.raises(ConfigError, match=rf"{M}.lora.rank=8 and {M}.lora_rank=4 set the same thing"):
        load_config(overrides=[f"{M}.lora_rank=4", f"{M}.lora.rank=8"])


def test_megatron_module_names_become_hugging_face_names():
    assert hf_target_modules(["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]) == "all-linear"
    assert hf_target_modules(["linear_fc1", "linear_fc2"]) == "gate_proj,up_proj,down_proj"
    assert hf_target_modules("q_proj,v_proj") == "q_proj,v_proj"
    # canonical LoRA's split names (verl's canonical_lora scripts)
    assert hf_target_modules(["linear_q", "linear_v", "linear_fc1_up"]) == "q_proj,v_proj,up_proj"
    import re

    pattern = exclude_regex(["lm_head"])
    assert re.fullmatch(pattern, "lm_head") and re.fullmatch(pattern, "model.lm_head")
    assert not re.fullmatch(pattern, "model.lm_head_extra") and exclude_regex([]) is None


def test_sapos_actor_level_temperatures_set_the_policy_loss_keys():
    cfg = load_config(overrides=["actor_rollout_ref.actor.tau_pos=2.0", "actor_rollout_ref.actor.tau_neg=3.0"])
    loss = cfg.actor_rollout_ref.actor.policy_loss
    assert (loss.tau_pos, loss.tau_neg) == (2.0, 3.0) and "tau_pos" not in cfg.actor_rollout_ref.actor
