r"""How a model writes a tool call in the agent loop, and how the result is written back (`rollout.multi_turn.format`).

- **tags** (null, the default; the seeds' format: ARPO, AEPO): the model writes `<python>code</python>` or
  `<search>query</search>`; generation stops at a tool's closing tag, the tool runs on the text between the
  segment's last opening tag and it, and ` <result>\n{text}\n</result>` is appended.
- **hermes** (verl's `multi_turn.format=hermes`, Qwen's and NousResearch's function-calling format): the model writes

      <tool_call>
      {"name": "python", "arguments": {"code": "print(1 + 1)"}}
      </tool_call>

  and generation stops at `</tool_call>`. The call names a loaded tool (`rollout.tools.tool_instances`) and its
  input is `arguments` when that is a string, its one string value, or its `code` / `query` / `input` entry. The
  result goes back as a `tool` message through the tokenizer's chat template (the assistant turn closed, the tool
  turn, a new assistant turn opened), or, for a tokenizer without a template that takes tool messages, as
  `\n<tool_response>\n{text}\n</tool_response>\n`. A call that is not valid JSON, names no tool or an unknown one,
  or has no usable input gets an error text naming the fault and the tools there are; the loop never stops on it.
- **qwen**, **qwen25** (SGLang's parser names for Qwen2.5 and Qwen3, which verl's SGLang rollout took as
  `multi_turn.format`): hermes, the same `<tool_call>` JSON.

verl 0.9.1's other tool parsers (gpt-oss, qwen3_coder, glm, seed, minimax, kimi, deepseek_v4, gemma4) read calls in
other wire syntaxes, which are not parsed here: naming one is a config error that says which syntax is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# Other names of a format parsed here -> that format.
FORMAT_ALIASES = {"qwen": "hermes", "qwen25": "hermes"}
FORMATS = ("tags", "hermes", *FORMAT_ALIASES)
# verl 0.9.1's tool parsers whose wire syntax is not parsed here -> that syntax.
UNPARSED_FORMATS = {
    "gpt-oss": "harmony messages on the commentary channel addressed to=functions.NAME, ended by <|call|>",
    "qwen3_coder": "XML calls <tool_call><function=NAME><parameter=KEY>...</parameter></function></tool_call>",
    "glm": "GLM's <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>",
    "seed": "Seed's <seed:tool_call><function=NAME><parameter=KEY>...</parameter></function></seed:tool_call>",
    "minimax": 'MiniMax\'s <minimax:tool_call><invoke name="NAME"><parameter name="KEY">...</minimax:tool_call>',
    "kimi": "Kimi K2's special tokens <|tool_calls_section_begin|><|tool_call_begin|>...",
    "deepseek_v4": "DeepSeek-V4's DSML markup (tool_calls, invoke name=NAME and parameter tags in DSML brackets)",
    "gemma4": "Gemma 4's <|tool_call>call:NAME{KEY:VALUE}<tool_call|>",
}
TAG_RESULT = " <result>\n{}\n</result>"
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
HERMES_PLAIN_RESULT = "\n<tool_response>\n{}\n</tool_response>\n"
# Argument names whose value is the tool's input when `arguments` holds several entries.
INPUT_ARGUMENTS = ("code", "query", "input")


@dataclass
class ToolCall:
    """One call found in a segment: the tool's name and input, or `error` (the text the model gets instead)."""

    tool: str
    content: str | None = None
    error: str | None = None
    arguments: dict | None = None  # the call's arguments as the model wrote them (hermes), for verl-style tools


class TagFormat:
    """The seeds' `<tool>input</tool>` calls (module docstring)."""

    name = "tags"

    def __init__(self, tool_names: list[str]):
        self.tool_names = list(tool_names)
        self.stop_strings = [f"</{tag}>" for tag in self.tool_names]

    def parse(self, text: str, stop: str) -> ToolCall:
        """The call that `stop` (one of stop_strings) closed in the segment's decoded `text`."""
        tag = stop[2:-1]
        body = text[: text.rfind(stop)]
        opening = body.rfind(f"<{tag}>")
        if opening < 0:
            return ToolCall(tag, error=f"Error: </{tag}> without an opening <{tag}> tag.")
        content = body[opening + len(tag) + 2:].strip()
        if not content:
            return ToolCall(tag, error=f"Error: empty <{tag}> call; put the input between <{tag}> and </{tag}>.")
        return ToolCall(tag, content)

    def result_text(self, text: str) -> str:
        return TAG_RESULT.format(text)

    def results_text(self, texts: list[str], closed_by: str | None = None) -> str:
        return "".join(TAG_RESULT.format(text) for text in texts)


class HermesFormat:
    """`<tool_call>{"name": ..., "arguments": ...}</tool_call>` calls, results as chat-template tool turns."""

    name = "hermes"
    stop_strings = [HERMES_CLOSE]

    def __init__(self, tool_names: list[str], tokenizer=None):
        self.tool_names = list(tool_names)
        self._write = _tool_turns(tokenizer)

    def parse(self, text: str, stop: str) -> ToolCall:
        body = text[: text.rfind(stop)]
        opening = body.rfind(HERMES_OPEN)
        if opening < 0:
            return ToolCall("", error=f"Error: {HERMES_CLOSE} without an opening {HERMES_OPEN}.")
        call = self.parse_block(body[opening + len(HERMES_OPEN):])
        if call.error is None and call.content is None:  # a tag-style tool takes one string
            call.error = (f"Error: the call of {call.tool} has no input; give it as "
                          f'"arguments": {{"{INPUT_ARGUMENTS[0]}": ...}}.')
        return call

    def parse_all(self, text: str) -> list[ToolCall]:
        """Every call of a finished assistant turn (verl's tool_agent: the turn ends at EOS, then all its
        `<tool_call>` blocks run), in order; an unclosed last block is a call with an error text."""
        calls = []
        for opened in text.split(HERMES_OPEN)[1:]:
            body, closed, _ = opened.partition(HERMES_CLOSE)
            calls.append(self.parse_block(body) if closed else
                         ToolCall("", error=f"Error: {HERMES_OPEN} without a closing {HERMES_CLOSE}."))
        return calls

    def parse_block(self, raw: str) -> ToolCall:
        """One call from the text between `<tool_call>` and `</tool_call>`."""
        raw = raw.strip()
        try:
            call = json.loads(raw)
        except json.JSONDecodeError as err:
            return ToolCall("", error=f"Error: the tool call is not valid JSON ({err.msg} at character {err.pos}); "
                                      'write {"name": <tool>, "arguments": {...}}.')
        name = call.get("name") if isinstance(call, dict) else None
        if not isinstance(name, str) or not name:
            return ToolCall("", error='Error: the tool call has no "name"; write {"name": <tool>, "arguments": '
                                      "{...}}.")
        if name not in self.tool_names:
            return ToolCall(name, error=f"Error: there is no tool named {name!r}; the tools are "
                                        f"{', '.join(self.tool_names) or 'none'}.")
        arguments = _arguments(call.get("arguments"))
        content = _tool_input(arguments)
        if not content and not arguments:
            return ToolCall(name, error=f"Error: the call of {name} has no input; give it as "
                                        f'"arguments": {{"{INPUT_ARGUMENTS[0]}": ...}}.')
        return ToolCall(name, content, arguments=arguments if isinstance(arguments, dict) else None)

    def result_text(self, text: str) -> str:
        return self._write([text])

    def results_text(self, texts: list[str], closed_by: str | None = None) -> str:
        """The results of a turn's calls, in order, as tool messages after the turn (`_tool_turns`)."""
        return self._write(texts, closed_by)


def _arguments(arguments):
    """The call's arguments, decoded when the model wrote them as a JSON string."""
    if isinstance(arguments, str):
        try:  # some models write the arguments as a JSON string
            decoded = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
        return decoded if isinstance(decoded, dict) else arguments
    return arguments


def _tool_input(arguments) -> str | None:
    """The one string a tag-style tool takes from a call's (decoded) arguments."""
    if isinstance(arguments, str):
        return arguments.strip() or None
    if not isinstance(arguments, dict):
        return None
    strings = {k: v for k, v in arguments.items() if isinstance(v, str) and v.strip()}
    if len(strings) == 1:
        return next(iter(strings.values())).strip()
    for key in INPUT_ARGUMENTS:
        if key in strings:
            return strings[key].strip()
    return None


def _tool_turns(tokenizer):
    """(results, closed_by) -> what follows the model's last token: the rest of its turn, one tool message per result
    and the next assistant turn's opening as the chat template writes them (found by rendering a conversation with
    and without tool messages), or plain <tool_response> blocks where the template cannot render tool messages.
    `closed_by`: the text of the token that ended the turn (the EOS, e.g. `<|im_end|>`), None when generation stopped
    at `</tool_call>` inside the turn."""
    answer = "\x00ANSWER\x00"
    convo = [{"role": "user", "content": "u"}, {"role": "assistant", "content": answer}]

    def marker(k: int) -> str:
        return f"\x00TOOL-RESULT-{k}\x00"

    def render(count: int) -> tuple[str, str]:
        before = tokenizer.apply_chat_template(convo, tokenize=False)
        after = tokenizer.apply_chat_template([*convo, *({"role": "tool", "content": marker(k)} for k in range(count))],
                                              tokenize=False, add_generation_prompt=True)
        if not (isinstance(before, str) and isinstance(after, str) and after.startswith(before)):
            raise ValueError("the rendering with a tool message does not extend the one without")
        closing = before[before.index(answer) + len(answer):]  # what ends the assistant's turn after its content
        turns = after[len(before):]
        if any(marker(k) not in turns for k in range(count)) or "\x00" in closing:
            raise ValueError("a tool message's content is not in its rendering")
        return closing, turns

    try:
        render(1)
    except Exception:  # no template, or one without tool messages: the plain blocks
        return lambda texts, closed_by=None: "".join(HERMES_PLAIN_RESULT.format(text) for text in texts)

    def write(texts: list[str], closed_by: str | None = None) -> str:
        closing, turns = render(len(texts))
        if closed_by and closing.startswith(closed_by):
            closing = closing[len(closed_by):]
        for k, text in enumerate(texts):
            turns = turns.replace(marker(k), text)
        return closing + turns

    return write


TRUNCATE_SIDES = ("left", "right", "middle")
TRUNCATED = "...(truncated)..."


def truncate_result(text: str, max_chars: int | None, side: str = "middle") -> str:
    """A tool's result text cut to `max_chars` characters (verl's `multi_turn.max_tool_response_length`; None = no
    limit): `left` keeps the start, `right` the end, `middle` both ends around a marker."""
    if max_chars is None or len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + TRUNCATED
    if side == "right":
        return TRUNCATED + text[-max_chars:]
    head = max_chars // 2
    return text[:head] + TRUNCATED + text[len(text) - (max_chars - head):]


def format_problem(name: str | None) -> str | None:
    """Why `rollout.multi_turn.format=name` cannot run here (one line naming the key), or None when it can."""
    key = f"actor_rollout_ref.rollout.multi_turn.format={name!r}"
    if name is None or name in FORMATS:
        return None
    if name in UNPARSED_FORMATS:
        return (f"{key}: verl's {name} tool parser reads {UNPARSED_FORMATS[name]}; that syntax is not parsed here "
                f"(the formats parsed: {', '.join(FORMATS)})")
    return (f"{key} must be one of {', '.join(FORMATS)} (null = tags, or hermes for mode=async with verl-style "
            "tools)")


def wire_format(name: str | None) -> str | None:
    """The format parsed for the name `name` (an alias gives its format); other names as they are."""
    return FORMAT_ALIASES.get(name, name)


def build_call_format(name: str | None, tool_names: list[str], tokenizer=None) -> TagFormat | HermesFormat:
    """The format `rollout.multi_turn.format` names (null = tags)."""
    problem = format_problem(name)
    if problem is not None:
        raise ValueError(problem)
    if wire_format(name) == "hermes":
        return HermesFormat(tool_names, tokenizer)
    return TagFormat(tool_names)
