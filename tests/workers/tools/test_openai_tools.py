"""verl's tool interface: schemas, the async tool, function tools, tag tools as verl tools, the tool YAML."""

from __future__ import annotations

import asyncio
import textwrap

import pytest
from pydantic import ValidationError

from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY, function_tool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.tools.tool_registry import load_all_tools, load_function_tools, load_tool_yaml
from verl.workers.tools.base import BaseTool as TagTool
from verl.workers.tools.base import ToolError
from verl.workers.tools.openai_tools import TagToolAdapter, schema_dicts


def run(coroutine):
    return asyncio.run(coroutine)


def schema(name: str, **properties) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"the {name} tool",
        "parameters": {"type": "object", "properties": properties, "required": list(properties)}}}


def write(path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


# ---------------------------------------------------------------------------------------------- schemas
def test_schema_round_trip_keeps_keywords_the_models_do_not_name():
    raw = {"type": "function", "function": {
        "name": "f", "description": "d", "strict": True,
        "parameters": {"type": "object", "additionalProperties": False, "required": ["n", "tags"], "properties": {
            "n": {"type": "integer", "description": "count", "minimum": 1, "maximum": 9},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
            "mode": {"type": ["string", "null"], "enum": ["a", "b"]}}}}}
    parsed = OpenAIFunctionToolSchema.model_validate(raw)
    assert parsed.model_dump(exclude_unset=True, exclude_none=True) == raw
    assert parsed.function.parameters.properties["n"].type == "integer"


def test_schema_errors():
    raw = schema("f", x={"type": "string"})
    del raw["function"]["parameters"]["properties"]["x"]["type"]
    with pytest.raises(ValidationError, match=r"properties\.x\.type"):
        OpenAIFunctionToolSchema.model_validate(raw)
    raw = schema("f", x={"type": "string"})
    raw["function"]["parameters"]["required"].append("y")
    with pytest.raises(ValidationError, match="'y'"):
        OpenAIFunctionToolSchema.model_validate(raw)


# ---------------------------------------------------------------------------------------------- the base tool
def test_base_tool_lifecycle():
    tool = BaseTool({"type": "native"}, OpenAIFunctionToolSchema.model_validate(schema("noop")))
    assert tool.name == "noop" and tool.get_openai_tool_schema() is tool.tool_schema
    instance_id, response = run(tool.create(create_kwargs={"a": 1}, b=2))
    assert len(instance_id) == 36 and response == ToolResponse()
    assert tool.instance(instance_id) == {"a": 1, "b": 2}
    assert run(tool.create("mine"))[0] == "mine"
    text, reward, metrics = run(tool.execute(instance_id, {}))
    assert text.text and reward == 0.0 and metrics == {}
    assert run(tool.calc_reward(instance_id)) == 0.0
    run(tool.release(instance_id))
    with pytest.raises(KeyError, match="create"):
        tool.instance(instance_id)
    with pytest.raises(ValueError, match="needs a tool_schema"):
        BaseTool({})


# ---------------------------------------------------------------------------------------------- the tool YAML
USER_TOOL = """
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import ToolResponse

    class EchoTool(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(text=self.config["prefix"] + parameters["text"]), 0.5, {"calls": 1}

    class NotATool:
        pass
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tmp_path / "my_tools_mod.py", USER_TOOL)
    return "my_tools_mod"


def test_yaml_loads_a_user_tool(tmp_path, user_module):
    path = write(tmp_path / "tools.yaml", f"""
        tools:
          - class_name: {user_module}.EchoTool
            config: {{type: native, prefix: "> "}}
            tool_schema:
              type: function
              function:
                name: echo
                description: Echo the text.
                parameters: {{type: object, properties: {{text: {{type: string}}}}, required: [text]}}
    """)
    [tool] = load_tool_yaml(path)
    assert tool.name == "echo" and tool.config == {"type": "native", "prefix": "> "}
    assert run(tool.execute("i", {"text": "hi"})) == (ToolResponse(text="> hi"), 0.5, {"calls": 1})
    assert schema_dicts([tool])[0]["function"]["parameters"]["required"] == ["text"]


def test_yaml_loads_our_python_tool_through_the_adapter(tmp_path):
    path = write(tmp_path / "tools.yaml", """
        tools:
          - class_name: verl.workers.rollout.tools.python_tool.PythonTool  # the seeds' alias
            config: {type: native, timeout_s: 5, memory_mb: 256}
    """)
    [tool] = load_all_tools(tool_config_path=path)
    assert isinstance(tool, TagToolAdapter) and tool.tool.limits.wall_time_s == 5
    assert tool.name == "python" and tool.tool_schema.function.parameters.required == ["code"]
    instance_id, _ = run(tool.create())
    response, reward, _ = run(tool.execute(instance_id, {"code": "print(1+2)"}))
    assert response.text == "3" and reward == 0.0


class _Flaky(TagTool):
    """Answer or fail.

    More detail the schema leaves out."""

    name = trigger_tag = "flaky"

    def execute(self, content: str) -> str:
        if content == "fail":
            raise ToolError("the backend is down")
        if content == "bug":
            raise RuntimeError("oops")
        return content.upper()


def test_tag_tool_adapter():
    tool = TagToolAdapter(_Flaky())
    function = tool.tool_schema.function
    assert function.description == "Answer or fail." and function.parameters.required == ["input"]
    assert run(tool.execute("i", {"input": "ok"}))[0].text == "OK"
    assert run(tool.execute("i", {"input": "fail"}))[0].text == \
        "Error: Tool(flaky) execution failed with message: the backend is down"
    assert "RuntimeError: oops" in run(tool.execute("i", {"input": "bug"}))[0].text
    assert "'input'" in run(tool.execute("i", {"text": "ok"}))[0].text
    renamed = TagToolAdapter(_Flaky(), schema("ask", question={"type": "string"}))
    assert renamed.name == "ask" and run(renamed.execute("i", {"question": "q"}))[0].text == "Q"


@pytest.mark.parametrize(("entry", "field"), [
    ("config: {{type: native}}", "tools[1].class_name is not set"),
    ("class_name: no_such_module_xyz.Tool", "tools[1].class_name=no_such_module_xyz.Tool cannot be imported"),
    ("class_name: {mod}.Missing", "tools[1].class_name={mod}.Missing cannot be imported"),
    ("class_name: {mod}.NotATool", "tools[1].class_name={mod}.NotATool is not a tool class"),
    ("class_name: {mod}.EchoTool\n    tool_schema: {{function: {{name: t1, description: d, parameters: "
     "{{properties: {{x: {{description: no type}}}}}}}}}}",
     "tools[1].tool_schema.function.parameters.properties.x.type: Field required"),
    ("class_name: {mod}.EchoTool\n    tool_schema: {{function: {{description: d}}}}",
     "tools[1].tool_schema.function.name: Field required"),
    ("class_name: {mod}.EchoTool\n    config: {{type: mcp}}", "tools[1].config.type=mcp: MCP tools are not built"),
    ("class_name: {mod}.EchoTool\n    config: {{type: http}}", "tools[1].config.type='http'"),
    ("class_name: {mod}.EchoTool\n    config: [1]", "tools[1].config must be a mapping"),
    ("class_name: {mod}.EchoTool\n    schema: {{}}", "tools[1].schema is not a tool entry key"),
    ("class_name: verl.workers.tools.python_tool.PythonTool\n    config: {{timeout: 3}}",
     "tools[1]: verl.workers.tools.python_tool.PythonTool could not be built"),
    ("class_name: {mod}.EchoTool\n    tool_schema: {{function: {{name: first, description: d}}}}",
     "two tools are named 'first' (tool_schema.function.name): {path}: tools[0] and {path}: tools[1]"),
])
def test_yaml_errors_name_the_file_the_entry_and_the_field(tmp_path, user_module, entry, field):
    path = tmp_path / "tools.yaml"  # entry: the second item's lines, indented by 4 after the first
    path.write_text(f"tools:\n  - class_name: {user_module}.EchoTool\n    tool_schema: {{function: {{name: first, "
                    f"description: d}}}}\n  - {entry.format(mod=user_module)}\n")
    with pytest.raises(ValueError) as caught:
        load_tool_yaml(str(path))
    assert str(path) in str(caught.value)
    assert field.format(mod=user_module, path=path) in str(caught.value)


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ValueError, match="tool_config_path=.*cannot read it"):
        load_tool_yaml(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="tools must be a list"):
        load_tool_yaml(write(tmp_path / "bad.yaml", "tools: {a: 1}\n"))


# ---------------------------------------------------------------------------------------------- function tools
FUNCTIONS = """
    import asyncio

    from verl.tools.function_tool import function_tool


    @function_tool
    def add(a: int, b: int = 2) -> int:
        \"\"\"Add two numbers.

        Args:
            a: the first number
            b: the second number
        \"\"\"
        return a + b


    @function_tool(name="shout")
    async def upper(text: str) -> str:
        \"\"\"Upper-case a text.

        Args:
            text: what to upper-case
        \"\"\"
        await asyncio.sleep(0)
        return text.upper()


    RAW = {"type": "function", "function": {"name": "pick", "description": "Pick.", "x-note": 1,
           "parameters": {"type": "object", "properties": {"k": {"type": "integer", "minimum": 0}}}}}


    @function_tool(schema=RAW)
    def pick(k=0):
        return {"k": k, "items": [1, 2]}


    @function_tool
    def fails(x: str) -> str:
        \"\"\"Fail.

        Args:
            x: anything
        \"\"\"
        raise ValueError(f"bad {x}")
"""


def test_function_tools_from_a_file(tmp_path):
    path = write(tmp_path / "fns.py", FUNCTIONS)
    tools = {tool.name: tool for tool in load_function_tools(path)}
    assert list(tools) == ["add", "shout", "pick", "fails"]
    add = tools["add"].tool_schema.model_dump(exclude_none=True)["function"]
    assert add == {"name": "add", "description": "Add two numbers.", "parameters": {
        "type": "object", "required": ["a"], "properties": {"a": {"type": "integer", "description": "the first number"},
                                                            "b": {"type": "integer", "description": "the second number"}}}}
    assert tools["pick"].tool_schema.model_dump(exclude_unset=True, exclude_none=True) == {
        "type": "function", "function": {"name": "pick", "description": "Pick.", "x-note": 1,
                                         "parameters": {"type": "object", "properties": {
                                             "k": {"type": "integer", "minimum": 0}}}}}
    assert FUNCTION_TOOL_REGISTRY["shout"] is tools["shout"]

    def call(name, arguments):
        tool = tools[name]
        instance_id, _ = run(tool.create())
        response, reward, _ = run(tool.execute(instance_id, arguments))
        run(tool.release(instance_id))
        assert reward == 0.0
        return response.text

    assert call("add", {"a": 3}) == "5"
    assert call("shout", {"text": "hi"}) == "HI"
    assert call("pick", {"k": 4}) == '{"k": 4, "items": [1, 2]}'
    assert call("fails", {"x": "q"}) == "Error: Tool(fails) execution failed with message: ValueError: bad q"
    assert "TypeError" in call("add", {"c": 1})  # arguments the function does not take


def test_function_tool_errors(tmp_path):
    def no_args(x: int) -> int:
        """Has no Args section."""
        return x

    with pytest.raises(ValueError, match="function_tool '.*no_args': cannot build its schema"):
        function_tool(no_args)
    with pytest.raises(ValueError, match="differs from its schema"):
        function_tool(name="other", schema=schema("mine"))(lambda: 1)
    with pytest.raises(ValueError, match="no function decorated"):
        load_function_tools(write(tmp_path / "empty.py", "x = 1\n"))
    with pytest.raises(ValueError, match="function_tool_path=.*no such file"):
        load_function_tools(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match="importing the file failed: ZeroDivisionError"):
        load_function_tools(write(tmp_path / "broken.py", "1 / 0\n"))


def test_duplicate_names_across_the_yaml_and_the_functions(tmp_path, user_module):
    yaml_path = write(tmp_path / "tools.yaml", f"""
        tools:
          - class_name: {user_module}.EchoTool
            tool_schema: {{function: {{name: add, description: d}}}}
    """)
    functions = write(tmp_path / "fns.py", FUNCTIONS)
    with pytest.raises(ValueError, match=r"two tools are named 'add'.*tools\[0\] and .*fns.py: function add"):
        load_all_tools(yaml_path, functions)
    assert [tool.name for tool in load_all_tools(None, functions)] == ["add", "shout", "pick", "fails"]
