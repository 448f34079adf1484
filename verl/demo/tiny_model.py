r"""Build a tiny Qwen2 chat model and its tokenizer from nothing, so tests and demos never download.

The tokenizer is a byte-level BPE trained in-process on the arithmetic demo task and a little English and maths
text. Its pipeline is Qwen2's (NFC, Qwen's split regex with one token per digit, byte-level), so transformers'
`Qwen2Tokenizer`, which `AutoTokenizer` picks for a qwen2 checkpoint and which rebuilds that pipeline from the
vocabulary and merges, tokenizes exactly like the trained tokenizer. It speaks ChatML like Qwen, and renders
tools, tool calls and tool results as Qwen2.5-Instruct does (CHAT_TEMPLATE)::

    <|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n

`<|endoftext|>` is the pad (and bos) token and `<|im_end|>` ends a turn (eos). The model is a randomly
initialised `Qwen2ForCausalLM` in float32 with tied embeddings, or with `reward_model=True` a
`Qwen2ForSequenceClassification` with one label (a reward model: one score per sequence). Both depend only on the
arguments: two builds with the same seed give byte-identical files.
"""

from __future__ import annotations

import json
import os

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

from verl.demo.arithmetic import make_arithmetic_rows, sft_text

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
TOKENIZER_VOCAB_SIZE = 768
# Qwen2's pre-tokenizer split: contractions, words, single digits, punctuation runs, newlines, spaces.
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# ChatML as Qwen2.5-Instruct writes it, tools included: with `tools`, the system turn lists their JSON schemas and
# tells the model to answer with <tool_call> blocks; an assistant message's `tool_calls` are written as such blocks;
# consecutive `tool` messages share one user turn of <tool_response> blocks. Without tools there is no default system
# message (Qwen adds one), so that prompts stay short for a tiny model.
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_INSTRUCTION = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def _literal(text: str) -> str:
    """`text` as a Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


CHAT_TEMPLATE = (
    "{%- set has_system = messages and messages[0]['role'] == 'system' -%}"
    "{%- set turns = messages[1:] if has_system else messages -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' + (messages[0]['content'] if has_system else " + _literal(QWEN_DEFAULT_SYSTEM) + ") -}}"
    "{{- " + _literal(TOOLS_PREAMBLE) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + _literal(TOOLS_INSTRUCTION + "<|im_end|>\n") + " -}}"
    "{%- elif has_system -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') -%}"
    "{{- '<|im_start|>assistant' + ('\\n' + message['content'] if message['content'] else '') -}}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set function = call['function'] if call['function'] is defined else call -%}"
    "{%- set arguments = function['arguments'] if function['arguments'] is string "
    "else function['arguments'] | tojson -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + function['name'] + '\", \"arguments\": ' + arguments "
    "+ '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_GENERIC_TEXT = """\
The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun.
A good answer explains each step before it gives the final result, so the reader can check it.
Let us think step by step. First we read the question, then we write down what we know.
The sum of two numbers is found by adding them together; the difference is found by subtracting.
To multiply a number by ten, write a zero at the end of it. Any number times zero is zero.
If a train travels 60 miles in one hour, how far does it travel in three hours? It travels 180 miles.
Alice has 12 apples and gives 5 of them to Bob. How many apples does Alice have left? She has 7 apples.
There are 24 hours in a day, 7 days in a week and about 30 days in a month.
An even number can be divided by two without a remainder; an odd number cannot.
The area of a rectangle is its length times its width. The perimeter is twice the sum of length and width.
We compute the average by adding all the values and dividing the total by how many values there are.
The answer is correct when it matches the reference exactly. Otherwise the answer is wrong.
You are a helpful assistant. Answer the user's question as clearly and briefly as you can.
Please reason about the problem, use the tools when they help, and put your final answer at the end.
The function returns the result of the computation, and the program prints it to the screen.
def add(a, b):
    return a + b
print(add(2, 3))
for i in range(10):
    total = total + i
Search the web for the capital of France. The capital of France is Paris.
Question: what is the largest planet in our solar system? Answer: Jupiter is the largest planet.
Water boils at 100 degrees Celsius and freezes at 0 degrees Celsius at sea level.
In mathematics, an equation states that two expressions are equal, for example x + 2 = 5 means x = 3.
The product of 6 and 7 is 42, the quotient of 42 and 6 is 7, and 42 minus 6 is 36.
Reinforcement learning rewards the model when its answer is right and gives less when it is wrong.
"""


def _tokenizer_corpus() -> list[str]:
    """Deterministic training text: chat-formatted arithmetic dialogues plus the generic text above."""
    dialogues = [
        f"user\n{row['prompt'][0]['content']}\nassistant\n{sft_text(row, worked=worked)}\n"
        for row in make_arithmetic_rows(512, seed=0, split="tokenizer")
        for worked in (False, True)
    ]
    return dialogues + _GENERIC_TEXT.splitlines(keepends=True)


def build_tokenizer(vocab_size: int = TOKENIZER_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer and wrap it for transformers (special tokens, chat template)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,  # ids 0, 1, 2 in this order; never split, dropped by skip_special_tokens
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_tiny_model(
    output_dir: str,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    vocab_size: int | None = None,
    reward_model: bool = False,
    tokenizer_vocab_size: int = TOKENIZER_VOCAB_SIZE,
) -> str:
    """Save a tiny Qwen2 model, its tokenizer and generation config to `output_dir`; returns `output_dir`.

    `vocab_size` is the model's embedding size; None uses the tokenizer's size. A larger value pads the embedding
    with rows no token maps to, as real Qwen checkpoints do (151936 rows for about 151665 tokens).
    `reward_model`: save a sequence-classification model with one label (`AutoModelForSequenceClassification`, the
    model `reward_model.model.path` names) instead of a causal LM; no generation config.
    `tokenizer_vocab_size`: tokens the BPE tokenizer learns; another size gives another tokenizer (other ids for
    the same text), e.g. a reward model that does not read the policy's tokens.
    """
    tokenizer = build_tokenizer(tokenizer_vocab_size)
    n_tokens = len(tokenizer)
    if vocab_size is None:
        vocab_size = n_tokens
    elif vocab_size < n_tokens:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer's {n_tokens} tokens")
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=not reward_model,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    if reward_model:
        config.num_labels = 1
    with torch.random.fork_rng(devices=[]):  # leave the caller's random state untouched
        torch.manual_seed(seed)
        model_cls = Qwen2ForSequenceClassification if reward_model else Qwen2ForCausalLM
        model = model_cls(config).to(torch.float32)
    if not reward_model:
        model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    tokenizer.model_max_length = max_position_embeddings
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    _name_tokenizer_class(output_dir, "Qwen2Tokenizer")
    return output_dir


def _name_tokenizer_class(output_dir: str, tokenizer_class: str) -> None:
    """Record the Qwen2 class instead of the generic one, which transformers 4.x does not know."""
    path = os.path.join(output_dir, "tokenizer_config.json")
    with open(path) as f:
        tokenizer_config = json.load(f)
    tokenizer_config["tokenizer_class"] = tokenizer_class
    with open(path, "w") as f:
        json.dump(tokenizer_config, f, indent=2, sort_keys=True)
        f.write("\n")
