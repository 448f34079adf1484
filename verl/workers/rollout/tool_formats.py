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
"""

from __future__ import annotations

import json
from dataclasses import dataclass

FORMATS = ("tags", "hermes")
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


class HermesFormat:
    """`<tool_call>{"name": ..., "arguments": ...}</tool_call>` calls, results as chat-template tool turns."""

    name = "hermes"
    stop_strings = [HERMES_CLOSE]

    def __init__(self, tool_names: list[str], tokenizer=None):
        self.tool_names = list(tool_names)
        self._wrap = _tool_turn(tokenizer)

    def parse(self, text: str, stop: str) -> ToolCall:
        body = text[: text.rfind(stop)]
        opening = body.rfind(HERMES_OPEN)
        if opening < 0:
            return ToolCall("", error=f"Error: {HERMES_CLOSE} without an opening {HERMES_OPEN}.")
        raw = body[opening + len(HERMES_OPEN):].strip()
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
        content = _tool_input(call.get("arguments"))
        if not content:
            return ToolCall(name, error=f"Error: the call of {name} has no input; give it as "
                                        f'"arguments": {{"{INPUT_ARGUMENTS[0]}": ...}}.')
        return ToolCall(name, content)

    def result_text(self, text: str) -> str:
        return self._wrap(text)


def _tool_input(arguments) -> str | None:
    if isinstance(arguments, str):
        try:  # some models write the arguments as a JSON string
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
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


def _tool_turn(tokenizer):
    """text -> what follows the model's `</tool_call>`: the rest of its turn, the tool turn and the next assistant
    turn's opening as the chat template writes them (found by rendering a conversation with and without a tool
    message), or the plain <tool_response> block where the template cannot render one."""
    marker, answer = "\x00TOOL-RESULT\x00", "\x00ANSWER\x00"
    try:
        convo = [{"role": "user", "content": "u"}, {"role": "assistant", "content": answer}]
        before = tokenizer.apply_chat_template(convo, tokenize=False)
        after = tokenizer.apply_chat_template([*convo, {"role": "tool", "content": marker}], tokenize=False,
                                              add_generation_prompt=True)
        if not (isinstance(before, str) and isinstance(after, str) and after.startswith(before)):
            raise ValueError("the rendering with a tool message does not extend the one without")
        closing = before[before.index(answer) + len(answer):]  # what ends the assistant's turn after its content
        head, found, tail = after[len(before):].partition(marker)
        if not found or "\x00" in head + tail + closing:
            raise ValueError("the tool message's content is not in its rendering")
    except Exception:  # no template, or one without tool messages: the plain block
        return HERMES_PLAIN_RESULT.format
    return lambda text: f"{closing}{head}{text}{tail}"


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


def build_call_format(name: str | None, tool_names: list[str], tokenizer=None) -> TagFormat | HermesFormat:
    """The format `rollout.multi_turn.format` names (null = tags)."""
    if name in (None, "tags"):
        return TagFormat(tool_names)
    if name == "hermes":
        return HermesFormat(tool_names, tokenizer)
    raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={name!r} must be one of {', '.join(FORMATS)} "
                     "(null = tags)")
