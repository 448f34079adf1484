"""A tiny reward model that does not read the policy's tokens: its own tokenizer (another vocabulary) and its own
chat template."""

from __future__ import annotations

import pytest

# "### role:" headers instead of the policy's ChatML, each turn closed by <|im_end|>.
OTHER_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '### ' + message['role'] + ':\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
)


@pytest.fixture(scope="session")
def other_tokenizer_reward_model_dir(tmp_path_factory):
    from transformers import AutoTokenizer

    from verl.demo.tiny_model import build_tiny_model

    out = str(tmp_path_factory.mktemp("other_tokenizer_reward_model"))
    build_tiny_model(out, seed=2, reward_model=True, tokenizer_vocab_size=512)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = OTHER_CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    return out
