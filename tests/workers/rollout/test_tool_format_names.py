"""The names `rollout.multi_turn.format` takes (verl/workers/rollout/tool_formats.py): each format parsed here and its
other names (qwen, qwen25: hermes) pass the config check and build their format; verl 0.9.1's tool parsers of other
wire syntaxes are refused before Ray, one line naming the format and the syntax that is not parsed."""

from __future__ import annotations

import json

import pytest

from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.utils.config import ConfigError
from verl.workers.rollout.agent_loops import call_format_name
from verl.workers.rollout.tool_formats import (
    FORMATS,
    UNPARSED_FORMATS,
    HermesFormat,
    TagFormat,
    build_call_format,
)

KEY = "actor_rollout_ref.rollout.multi_turn.format"
TOOLS = ["search"]
CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>'


@pytest.mark.parametrize("name", [None, *FORMATS])
def test_each_accepted_name_passes_the_check_and_builds_its_format(name):
    validate_ppo_config(load_config(overrides=[f"{KEY}={'null' if name is None else name}"]))
    call_format = build_call_format(name, TOOLS)
    if name in (None, "tags"):
        assert isinstance(call_format, TagFormat) and call_format.stop_strings == ["</search>"]
        return
    assert isinstance(call_format, HermesFormat)  # hermes, and Qwen's names for the same <tool_call> JSON
    call = call_format.parse("I will look it up. " + CALL, "</tool_call>")
    assert (call.tool, call.content, call.error) == ("search", "capital of France", None)


@pytest.mark.parametrize("name", ["qwen", "qwen25"])
def test_qwens_names_run_the_agent_loop_as_hermes(name):
    assert call_format_name({"multi_turn": {"format": name}}) == "hermes"


@pytest.mark.parametrize("name", sorted(UNPARSED_FORMATS))
def test_a_tool_parser_of_another_wire_syntax_is_refused_naming_it(name):
    message = f"{KEY}='{name}': verl's {name} tool parser reads {UNPARSED_FORMATS[name]}; that syntax is not parsed"
    with pytest.raises(ConfigError) as refused:
        validate_ppo_config(load_config(overrides=[f"{KEY}={json.dumps(name)}"]))
    (line,) = [line for line in str(refused.value).splitlines() if KEY in line]
    assert message in line and line.endswith("(the formats parsed: tags, hermes, qwen, qwen25)")
    with pytest.raises(ValueError, match="that syntax is not parsed here"):
        build_call_format(name, TOOLS)


def test_an_unknown_name_lists_the_accepted_ones():
    with pytest.raises(ConfigError, match=rf"{KEY}='json' must be one of tags, hermes, qwen, qwen25"):
        validate_ppo_config(load_config(overrides=[f"{KEY}=json"]))
