"""verl's `verl.utils.tokenizer`: `hf_tokenizer(path)`, a Hugging Face tokenizer with a pad token, as verl's recipes
and data scripts load one."""

from __future__ import annotations

from typing import Any

GEMMA2_EOS = "<end_of_turn>"  # what ends gemma-2-2b-it's replies; its own eos token does not


def set_pad_token_id(tokenizer: Any) -> None:
    """Pad with the eos token when the tokenizer has no pad token (batches are padded, and most chat models ship
    without one)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token


def hf_tokenizer(name_or_path: str, correct_pad_token: bool = True, correct_gemma2: bool = True, **kwargs: Any) -> Any:
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)`, with a pad token (`correct_pad_token`) and, for
    gemma-2-2b-it, `<end_of_turn>` as its eos token (`correct_gemma2`), as in verl."""
    from transformers import AutoTokenizer

    if correct_gemma2 and isinstance(name_or_path, str) and "gemma-2-2b-it" in name_or_path:
        kwargs["eos_token"] = GEMMA2_EOS
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if correct_pad_token:
        set_pad_token_id(tokenizer)
    return tokenizer


def hf_processor(name_or_path: str, **kwargs: Any) -> None:
    """verl's multimodal processor; None, verl's answer for a text-only model: Quiver trains text-only models."""
    return None
