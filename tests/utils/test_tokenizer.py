"""verl/utils/tokenizer.py: verl's tokenizer loader gives a tokenizer that pads."""

from types import SimpleNamespace

from verl.utils.tokenizer import hf_processor, hf_tokenizer, set_pad_token_id


def test_a_tokenizer_without_a_pad_token_pads_with_eos():
    tokenizer = SimpleNamespace(pad_token_id=None, pad_token=None, eos_token="<|im_end|>")
    set_pad_token_id(tokenizer)
    assert tokenizer.pad_token == "<|im_end|>"
    padded = SimpleNamespace(pad_token_id=0, pad_token="<pad>", eos_token="<|im_end|>")
    set_pad_token_id(padded)
    assert padded.pad_token == "<pad>"


def test_hf_tokenizer_loads_a_local_tokenizer(tiny_model_dir):
    tokenizer = hf_tokenizer(tiny_model_dir)
    assert tokenizer.pad_token_id is not None
    assert tokenizer.decode(tokenizer("1 + 2 = 3")["input_ids"]).replace(" ", "") == "1+2=3"
    assert hf_processor(tiny_model_dir) is None  # text-only models here, as verl answers for one
