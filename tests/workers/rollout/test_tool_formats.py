"""Tool-call formats of the agent loop (verl/workers/rollout/tool_formats.py): hermes calls parsed, or an error text
for the model, never a crash; results written back through the chat template; the loop running hermes calls."""

from __future__ import annotations

import json

import pytest
from scripted_engine import TOK, ScriptedEngine
from test_tool_rounds import PARAMS, FakeTools, prompts_for

from verl.workers.config.rollout import BranchingConfig
from verl.workers.rollout.tool_formats import HERMES_PLAIN_RESULT, HermesFormat, TagFormat, build_call_format
from verl.workers.rollout.tool_rounds import ToolRoundLoop

TOOLS = ["python", "search"]


def hermes_call(name, arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.mark.parametrize(("text", "tool", "content"), [
    (hermes_call("python", {"code": "print(1 + 1)"}), "python", "print(1 + 1)"),
    (hermes_call("search", {"query": "capital of France"}), "search", "capital of France"),
    (hermes_call("python", {"code": "x = 1", "timeout": "5"}), "python", "x = 1"),  # several: the `code` entry
    (hermes_call("python", json.dumps({"code": "print(3)"})), "python", "print(3)"),  # arguments as a JSON string
    ("thinking " + hermes_call("python", {"code": "old"}) + " then " + hermes_call("search", {"q": "new"}),
     "search", "new"),  # the segment's last call is the one its stop closed
])
def test_a_hermes_call_names_its_tool_and_input(text, tool, content):
    call = HermesFormat(TOOLS).parse(text, "</tool_call>")
    assert (call.tool, call.content, call.error) == (tool, content, None)


@pytest.mark.parametrize(("text", "error"), [
    ('<tool_call>{"name": "python", "arguments": {"code": }</tool_call>', "Error: the tool call is not valid JSON"),
    ("print(1)</tool_call>", "Error: </tool_call> without an opening <tool_call>."),
    (hermes_call("calculator", {"expression": "1+1"}), "Error: there is no tool named 'calculator'; the tools are "
                                                        "python, search."),
    ('<tool_call>{"arguments": {"code": "1"}}</tool_call>', 'Error: the tool call has no "name"'),
    (hermes_call("python", {}), "Error: the call of python has no input"),
    ('<tool_call>["python"]</tool_call>', 'Error: the tool call has no "name"'),
])
def test_a_bad_hermes_call_becomes_an_error_text_for_the_model(text, error):
    call = HermesFormat(TOOLS).parse(text, "</tool_call>")
    assert call.content is None and call.error.startswith(error)


class ChatMLTokenizer:
    """apply_chat_template as Qwen2.5's template renders a conversation (a system turn first, tool messages as
    <tool_response> blocks in a user turn)."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        for message in messages:
            if message["role"] == "tool":
                text += f"<|im_start|>user\n<tool_response>\n{message['content']}\n</tool_response><|im_end|>\n"
            else:
                text += f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n"
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class NoTemplate:
    def apply_chat_template(self, *args, **kwargs):
        raise ValueError("this tokenizer has no chat template")


def test_a_result_goes_back_as_the_chat_templates_tool_turn():
    text = HermesFormat(TOOLS, ChatMLTokenizer()).result_text("2")
    assert text == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert HermesFormat(TOOLS, NoTemplate()).result_text("2") == HERMES_PLAIN_RESULT.format("2")
    assert HermesFormat(TOOLS, None).result_text("2") == HERMES_PLAIN_RESULT.format("2")


def test_the_format_is_chosen_by_name():
    assert isinstance(build_call_format(None, TOOLS), TagFormat)
    assert build_call_format("tags", TOOLS).stop_strings == ["</python>", "</search>"]
    assert build_call_format("hermes", TOOLS).stop_strings == ["</tool_call>"]
    with pytest.raises(ValueError, match="multi_turn.format='json' must be one of tags, hermes"):
        build_call_format("json", TOOLS)


def test_the_loop_runs_hermes_calls_and_masks_their_results():
    """Two calls in one assistant turn (one per segment: generation stops at each </tool_call>), a malformed one
    answered with an error text, then the answer; results are masked out of the loss."""
    first, second = hermes_call("python", {"code": "print(2)"}), hermes_call("search", {"query": "q"})
    segments = iter([first, second, '<tool_call>{"name": </tool_call>', " answer$"])
    loop = ToolRoundLoop(ScriptedEngine(lambda prompt, response: (next(segments), 0.5)), TOK, FakeTools(),
                     BranchingConfig(entropy_mode="exact"), seed=0, call_format="hermes")
    (traj,), = loop.run(prompts_for(1), n=1, params=PARAMS, response_length=2000)[0]
    assert loop.tools.calls == [("python", "print(2)"), ("search", "q")]
    result = [HERMES_PLAIN_RESULT.format(t) for t in ("ran python: print(2)", "ran search: q")]
    text = TOK.decode(traj.response)
    assert text.startswith(first + result[0] + second + result[1] + '<tool_call>{"name": </tool_call>')
    assert "Error: the tool call is not valid JSON" in text and text.endswith(" answer")
    assert all(p.stop == ["</tool_call>"] for _, p in loop.engine.requests)
    start = len(first)
    assert traj.mask[:start] == [1] * start and traj.mask[start:start + len(result[0])] == [0] * len(result[0])
    assert traj.calls == 3 and traj.finish_reason == "stop"


@pytest.mark.parametrize(("side", "expected"), [("left", "abcd...(truncated)..."), ("right", "...(truncated)...ghij"),
                                                ("middle", "ab...(truncated)...ij")])
def test_a_long_tool_result_is_cut_at_the_chosen_side(side, expected):
    from verl.workers.rollout.tool_formats import truncate_result

    assert truncate_result("abcdefghij", 4, side) == expected
    assert truncate_result("abc", 4, side) == "abc" and truncate_result("abcdefghij", None, side) == "abcdefghij"


def test_the_loop_honours_verls_turn_and_result_length_limits():
    """max_assistant_turns=2: the second turn's call is not run and the trajectory ends there;
    max_tool_response_length cuts the first result."""
    call = hermes_call("python", {"code": "print(2)"})
    segments = iter([call, call, " never$"])
    loop = ToolRoundLoop(ScriptedEngine(lambda prompt, response: (next(segments), 0.5)), TOK,
                     FakeTools(answer=lambda tag, content: "0123456789" * 3), BranchingConfig(entropy_mode="exact"),
                     seed=0, call_format="hermes", max_assistant_turns=2, max_tool_response_length=10,
                     tool_response_truncate_side="left")
    (traj,), = loop.run(prompts_for(1), n=1, params=PARAMS, response_length=2000)[0]
    assert loop.tools.calls == [("python", "print(2)")]  # one call run; the second turn's is not
    assert TOK.decode(traj.response) == call + HERMES_PLAIN_RESULT.format("0123456789...(truncated)...") + call
    assert traj.finish_reason == "length" and len(loop.engine.requests) == 2


def test_verls_multi_turn_limits_are_checked_by_name():
    from verl.trainer.config import load_config
    from verl.trainer.ppo.config_rules import validate_ppo_config
    from verl.utils.config import ConfigError

    with pytest.raises(ConfigError, match=r"multi_turn.max_assistant_turns=0 must be >= 1.*\n.*"
                                          r"tool_response_truncate_side='top' must be one of left, right, middle"):
        validate_ppo_config(load_config(overrides=["actor_rollout_ref.rollout.multi_turn.max_assistant_turns=0",
                                                   "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=top"]))
