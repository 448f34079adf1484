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
