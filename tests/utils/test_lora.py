"""LoRA helpers: folding adapters into base weights gives the adapted model's outputs; the adapter alone exports."""

from __future__ import annotations

import pytest
import torch

from verl.utils.lora import adapter_items, apply_lora, is_peft_model, lora_scaling, merge_lora_items


@pytest.fixture()
def adapted(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), rank=4, alpha=8, target_modules="all-linear")
    with torch.no_grad():  # peft starts B at zero (a no-op adapter): give it weights
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return model.eval()


def test_only_adapters_train(adapted):
    trainable = [name for name, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert is_peft_model(adapted) and lora_scaling(adapted) == 2.0


def test_folded_weights_reproduce_the_adapted_model(adapted, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    state = dict(merge_lora_items(adapted.state_dict().items(), lora_scaling(adapted)))
    assert set(state) == set(merged.state_dict())  # the base architecture's names, nothing left over
    merged.load_state_dict(state)
    ids = torch.randint(3, 500, (2, 12))
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, adapted(ids).logits, atol=1e-5)
        with adapted.disable_adapter():  # the reference policy: the base model
            base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
            assert torch.allclose(adapted(ids).logits, base(ids).logits, atol=1e-6)


def test_incomplete_lora_layers_are_an_error():
    with pytest.raises(ValueError, match="without all of base weight"):
        list(merge_lora_items([("base_model.model.x.base_layer.weight", torch.zeros(2, 2))], 1.0))


def test_adapter_export_names(adapted):
    names = list(adapter_items(adapted.state_dict()))
    assert names and all(".default." not in n and ("lora_A.weight" in n or "lora_B.weight" in n) for n in names)


def test_lora_starts_from_a_saved_adapter(adapted, tiny_model_dir, tmp_path):
    """lora_adapter_path (verl's key): its adapter_config.json decides rank, alpha and targets, and the loaded adapter
    is the saved one, trainable; lora_rank alone decides otherwise; neither means full fine-tuning."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from verl.utils.lora import load_lora_adapter, lora_settings

    adapted.save_pretrained(tmp_path / "adapter")
    model_cfg = OmegaConf.create({"lora_rank": 0, "lora_alpha": 16, "target_modules": "all-linear",
                                  "lora_adapter_path": str(tmp_path / "adapter")})
    rank, alpha, targets = lora_settings(model_cfg)
    assert (rank, alpha) == (4, 8.0) and any(str(t).endswith("q_proj") for t in targets)
    loaded = load_lora_adapter(AutoModelForCausalLM.from_pretrained(tiny_model_dir), model_cfg.lora_adapter_path)
    saved = {n: p for n, p in adapted.named_parameters() if "lora_" in n}
    got = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
    assert got.keys() == saved.keys() and all(torch.equal(got[n], saved[n]) for n in saved)
    assert all(p.requires_grad for p in got.values()) and lora_scaling(loaded) == 2.0
    assert lora_settings(OmegaConf.merge(model_cfg, {"lora_adapter_path": None, "lora_rank": 8})) == (8, 16,
                                                                                                      "all-linear")
    assert lora_settings(OmegaConf.merge(model_cfg, {"lora_adapter_path": None})) is None


def test_a_saved_adapter_of_another_rank_or_none_at_all_is_a_config_error(adapted, tiny_model_dir, tmp_path):
    from verl.trainer.config import load_config
    from verl.trainer.ppo.config_rules import validate_ppo_config
    from verl.utils.config import ConfigError

    adapted.save_pretrained(tmp_path / "adapter")
    base = [f"actor_rollout_ref.model.path={tiny_model_dir}"]
    validate_ppo_config(load_config(overrides=[*base, f"actor_rollout_ref.model.lora_adapter_path={tmp_path}/adapter",
                                               "actor_rollout_ref.model.lora_rank=4"]))
    with pytest.raises(ConfigError, match=r"lora_rank=8 but the adapter at .* has r=4: set lora_rank=4"):
        validate_ppo_config(load_config(overrides=[*base, "actor_rollout_ref.model.lora_rank=8",
                                                   f"actor_rollout_ref.model.lora_adapter_path={tmp_path}/adapter"]))
    with pytest.raises(ConfigError, match=r"lora_adapter_path=.*: no adapter_config.json there"):
        validate_ppo_config(load_config(overrides=[*base, f"actor_rollout_ref.model.lora_adapter_path={tmp_path}"]))
