"""verl's tool interface: async tools with an OpenAI function schema, listed in a tool YAML or written as functions.

A tool (`OpenAITool`; verl's `verl.tools.base_tool.BaseTool`) is built as `Tool(config, tool_schema)` and serves one
trajectory at a time through an instance id::

    instance_id, _ = await tool.create(create_kwargs={"ground_truth": "42"})   # or create(ground_truth="42")
    response, step_reward, metrics = await tool.execute(instance_id, {"answer": "42"})
    score = await tool.calc_reward(instance_id)
    await tool.release(instance_id)

`response` is a ToolResponse (text, images, videos); `step_reward` is added to the trajectory at this turn.

**The tool YAML** (`actor_rollout_ref.rollout.multi_turn.tool_config_path`), verl's format::

    tools:
      - class_name: pkg.module.MyTool        # an OpenAITool subclass, or one of our tag tools (below)
        config: {type: native}               # passed to the constructor; type native (mcp is not built here)
        tool_schema:                         # optional when the class supplies get_openai_tool_schema()
          type: function
          function: {name: my_tool, description: ..., parameters: {type: object, properties: {...}, required: [...]}}

A `class_name` naming one of the seed projects' tag tools (`verl.workers.tools.python_tool.PythonTool`, the
search tool, or their aliases in manager.CLASS_ALIASES) builds the tag tool with `config` minus `type` as its params
and wraps it in TagToolAdapter: one required string parameter (`code` for python, `query` for search, `input`
otherwise; the schema is made when the YAML gives none).

**Function tools** (`multi_turn.function_tool_path`, a Python file): each function decorated with `@function_tool`
becomes a stateless tool; its schema comes from the type hints and the Google-style "Args:" section of its
docstring (transformers' get_json_schema) unless `schema=` gives it. A call is `fn(**arguments)`: a sync function
runs in a thread, an async one is awaited; the return value is the response text (a str as it is, anything else as
JSON, or str() when it is not JSON); an exception becomes an error text, never the caller's exception.

`load_all_tools(tool_config_path, function_tool_path)` loads both; tool names must be unique across them.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import sys
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from pydantic import ValidationError

from verl.workers.tools.base import BaseTool as TagTool
from verl.workers.tools.base import ToolError
from verl.workers.tools.openai_schemas import OpenAIFunctionToolSchema, ToolResponse

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"


def failure_text(name: str, err: Exception) -> str:
    """The response text of a call that raised `err`."""
    message = str(err) if isinstance(err, ToolError) else f"{type(err).__name__}: {err}"
    return f"Error: Tool({name}) execution failed with message: {message}"


def validation_text(err: ValidationError, where: str) -> str:
    """Each problem of a pydantic error as `where.field.path: message`."""
    return "; ".join(".".join([where, *map(str, problem["loc"])]) + f": {problem['msg']}" for problem in err.errors())


def as_schema(schema: OpenAIFunctionToolSchema | Mapping, where: str) -> OpenAIFunctionToolSchema:
    """`schema` validated; a ValueError naming the field at fault (under `where`) when it does not validate."""
    if isinstance(schema, OpenAIFunctionToolSchema):
        return schema
    try:
        return OpenAIFunctionToolSchema.model_validate(schema)
    except ValidationError as err:
        raise ValueError(validation_text(err, where)) from err


def schema_dict(tool) -> dict[str, Any]:
    """A verl-style tool's schema as the chat template's `tools` argument takes it (the fields it sets)."""
    schema = tool.get_openai_tool_schema()
    return schema.model_dump(exclude_unset=True, exclude_none=True) if hasattr(schema, "model_dump") else dict(schema)


def schema_dicts(tools) -> list[dict[str, Any]]:
    """`schema_dict` of each tool, in order."""
    return [schema_dict(tool) for tool in tools]


# ---------------------------------------------------------------------------------------------- the tool
class OpenAITool:
    """verl's BaseTool. The defaults keep one dict per instance (the create keywords) and do nothing else: a
    subclass overrides execute, and calc_reward when the tool scores the trajectory."""

    def __init__(self, config: dict | None = None, tool_schema: OpenAIFunctionToolSchema | Mapping | None = None):
        self.config = dict(config or {})
        self.tool_schema = tool_schema
        if tool_schema is None:  # a subclass may build its own
            self.tool_schema = self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__} needs a tool_schema: none was given and its "
                             "get_openai_tool_schema() returns none")
        self.tool_schema = as_schema(self.tool_schema, "tool_schema")
        self.name = self.tool_schema.function.name
        self._instance_dict: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start an instance (a fresh id when `instance_id` is None); `kwargs` as create_kwargs() reads them."""
        instance_id = str(uuid.uuid4()) if instance_id is None else instance_id
        self._instance_dict[instance_id] = create_kwargs(kwargs)
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """One call with the model's arguments: (response, step reward, metrics)."""
        return ToolResponse(text="The tool's state was updated."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instance_dict.pop(instance_id, None)

    def instance(self, instance_id: str) -> dict[str, Any]:
        """The state of a created instance; a KeyError saying so for an id never created or already released."""
        if instance_id not in self._instance_dict:
            raise KeyError(f"tool {self.name}: no instance {instance_id!r}; call create() first")
        return self._instance_dict[instance_id]


def create_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords of create(): verl's agent loop passes them as `create_kwargs={...}`, a direct call as keywords;
    both are accepted and a direct keyword wins."""
    rest = {key: value for key, value in kwargs.items() if key != "create_kwargs"}
    return {**(kwargs.get("create_kwargs") or {}), **rest}


# ---------------------------------------------------------------------------------------------- function tools
class FunctionTool(OpenAITool):
    """A plain function as a stateless tool: a call is `fn(**parameters)` (module docstring)."""

    def __init__(self, fn: Callable, tool_schema: OpenAIFunctionToolSchema):
        super().__init__({"type": "function"}, tool_schema)
        self.fn = fn

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await self.fn(**(parameters or {}))
            else:
                value = await asyncio.to_thread(self.fn, **(parameters or {}))
        except Exception as err:  # the model's arguments or the function's own bug: the model reads about it
            return ToolResponse(text=failure_text(self.name, err)), 0.0, {}
        return as_response(value), 0.0, {}


def as_response(value: Any) -> ToolResponse:
    """A function's return value as a response: a ToolResponse as it is, a str as the text, else JSON or str()."""
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, str):
        return ToolResponse(text=value)
    try:
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError):
        return ToolResponse(text=str(value))


FUNCTION_TOOL_REGISTRY: dict[str, FunctionTool] = {}  # every decorated function by tool name; the latest wins
_MARK = "__function_tool__"  # the attribute on a decorated function holding its FunctionTool
_collecting: list[list[FunctionTool]] = []  # the tools registered while load_function_tools imports a file


def function_tool(fn: Callable | None = None, *, name: str | None = None,
                  schema: OpenAIFunctionToolSchema | Mapping | None = None) -> Callable:
    """Register `fn` as a tool: `@function_tool`, or `@function_tool(name=..., schema=...)`. `name` renames the
    generated schema; `schema` is used as it is instead. Returns `fn` itself, still callable as before."""
    if fn is not None and not callable(fn):
        raise TypeError(f"function_tool takes the function, or only the keywords name= and schema= (got {fn!r})")

    def register(fn: Callable) -> Callable:
        tool = FunctionTool(fn, function_schema(fn, name, schema))
        FUNCTION_TOOL_REGISTRY[tool.name] = tool
        setattr(fn, _MARK, tool)
        if _collecting:
            _collecting[-1].append(tool)
        return fn

    return register if fn is None else register(fn)


def function_schema(fn: Callable, name: str | None, schema: OpenAIFunctionToolSchema | Mapping | None
                    ) -> OpenAIFunctionToolSchema:
    """The tool schema of a decorated function (function_tool)."""
    label = f"function_tool {getattr(fn, '__qualname__', fn)!r}"
    if schema is None:
        from transformers.utils import get_json_schema

        try:
            schema = get_json_schema(fn)
        except Exception as err:
            raise ValueError(f"{label}: cannot build its schema ({err}). Annotate every parameter with a type and "
                             "describe each under 'Args:' in a Google-style docstring, or pass schema=") from err
        schema["function"].pop("return", None)  # not part of the OpenAI function format
        if name is not None:
            schema["function"]["name"] = name
    tool_schema = as_schema(schema, f"{label}: schema")
    if name is not None and tool_schema.function.name != name:
        raise ValueError(f"{label}: name={name!r} differs from its schema's function.name "
                         f"{tool_schema.function.name!r}; give one of them")
    return tool_schema


def _function_tools(path: str) -> list[tuple[str, FunctionTool]]:
    """(where, tool) for each function tool of the Python file at `path`: those registered while it is imported,
    and decorated functions it imports from modules imported before."""
    file = Path(path)
    where = f"{MULTI_TURN}.function_tool_path={path}"
    if not file.is_file():
        raise ValueError(f"{where}: no such file")
    module_name = f"quiver_function_tools_{file.stem}_{uuid.uuid4().hex[:8]}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(module_name, file))
    registered: list[FunctionTool] = []
    _collecting.append(registered)
    sys.modules[module_name] = module  # so that pickling its functions (Ray) finds the module
    try:
        module.__spec__.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise ValueError(f"{where}: importing the file failed: {type(err).__name__}: {err}") from err
    finally:
        _collecting.pop()
    marked = [getattr(value, "__dict__", {}).get(_MARK) for value in vars(module).values()]
    imported = [tool for tool in marked if isinstance(tool, FunctionTool)]
    tools = list({id(tool): tool for tool in registered + imported}.values())
    if not tools:
        raise ValueError(f"{where}: the file has no function decorated with @function_tool "
                         "(from verl.tools.function_tool import function_tool)")
    return [(f"{path}: function {tool.fn.__qualname__}", tool) for tool in tools]


# ---------------------------------------------------------------------------------------------- tag tools
TAG_TOOL_SCHEMAS = {  # trigger tag -> (description, argument, its description); other tag tools take `input`
    "python": ("Run Python code in a sandbox and return what it printed. Nothing is kept between calls.",
               "code", "The code; print what you want to see (the value of a last bare expression is printed)."),
    "search": ("Search for a query and return the top passages.", "query", "What to search for."),
}


def tag_tool_schema(tool: TagTool) -> OpenAIFunctionToolSchema:
    """A schema for a tag tool: one required string argument, the text the tool would find between its tags."""
    generic = ((inspect.getdoc(type(tool)) or f"The {tool.name} tool.").split("\n\n")[0].replace("\n", " "),
               "input", "The tool's input.")
    description, argument, described = TAG_TOOL_SCHEMAS.get(tool.trigger_tag, generic)
    return as_schema({"type": "function", "function": {
        "name": tool.name, "description": description,
        "parameters": {"type": "object", "properties": {argument: {"type": "string", "description": described}},
                       "required": [argument]}}}, "tool_schema")


class TagToolAdapter(OpenAITool):
    """One of the seed projects' tag tools (`execute(content) -> text`, blocking) as a verl-style tool. The content
    is the schema's first required argument; the tool runs in a thread, and its ToolError becomes the text."""

    def __init__(self, tool: TagTool, tool_schema: OpenAIFunctionToolSchema | Mapping | None = None,
                 config: dict | None = None):
        self.tool = tool
        super().__init__(config or {"type": "native"}, tool_schema or tag_tool_schema(tool))
        required = self.tool_schema.function.parameters.required
        if not required:
            raise ValueError(f"tool_schema of {self.name}: parameters.required must name the argument that holds "
                             f"the {tool.name} tool's input")
        self.input_name = required[0]

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        content = (parameters or {}).get(self.input_name)
        if not isinstance(content, str):
            return ToolResponse(text=f"Error: Tool({self.name}) needs the string argument {self.input_name!r}."), \
                0.0, {}
        try:
            text = await asyncio.to_thread(self.tool.execute, content)
        except Exception as err:  # ToolError, or a bug in the tool: the rollout goes on
            return ToolResponse(text=failure_text(self.name, err)), 0.0, {}
        return ToolResponse(text=text), 0.0, {}


# ---------------------------------------------------------------------------------------------- the tool YAML
ENTRY_KEYS = ("class_name", "config", "tool_schema")


def import_class(where: str, class_name: str) -> type:
    """The class at the dotted path `class_name` (or one of manager.CLASS_ALIASES); a ValueError naming `where`."""
    from verl.workers.tools.manager import CLASS_ALIASES  # here: the manager imports the rollout package

    module_name, _, attribute = CLASS_ALIASES.get(class_name, class_name).rpartition(".")
    try:
        if not module_name:
            raise ImportError("it is not a dotted path module.Class")
        cls = getattr(importlib.import_module(module_name), attribute)
    except Exception as err:  # ImportError, AttributeError, or what the module raised while importing
        raise ValueError(f"{where}.class_name={class_name} cannot be imported: {type(err).__name__}: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, OpenAITool | TagTool)):
        raise ValueError(f"{where}.class_name={class_name} is not a tool class: subclass verl.tools.base_tool.BaseTool"
                         " (or Quiver's tag-style verl.workers.tools.base.BaseTool)")
    return cls


def _entry_tool(where: str, entry: Any) -> OpenAITool:
    """The tool of one entry of the YAML's `tools` list (`where` names it)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a mapping with the keys {list(ENTRY_KEYS)}")
    unknown = [key for key in entry if key not in ENTRY_KEYS]
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not a tool entry key; the keys are {list(ENTRY_KEYS)}")
    class_name, config = entry.get("class_name"), entry.get("config") or {}
    if not class_name or not isinstance(class_name, str):
        raise ValueError(f"{where}.class_name is not set: give the tool's class as module.Class")
    if not isinstance(config, Mapping):
        raise ValueError(f"{where}.config must be a mapping")
    kind = config.get("type", "native")
    if kind == "mcp":
        raise ValueError(f"{where}.config.type=mcp: MCP tools are not built in Quiver; write the tool as a native "
                         "class or a @function_tool function")
    if kind != "native":
        raise ValueError(f"{where}.config.type={kind!r} must be 'native'")
    cls = import_class(where, class_name)
    schema = entry.get("tool_schema")
    schema = None if schema is None else as_schema(schema, f"{where}.tool_schema")
    try:
        if issubclass(cls, TagTool):
            return TagToolAdapter(cls(**{k: v for k, v in config.items() if k != "type"}), schema, dict(config))
        return cls(config=dict(config), tool_schema=schema)
    except Exception as err:
        raise ValueError(f"{where}: {class_name} could not be built from its config and tool_schema: "
                         f"{type(err).__name__}: {err}") from err


def _yaml_tools(path: str) -> list[tuple[str, OpenAITool]]:
    """(where, tool) for each entry of the tool YAML at `path`."""
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except OSError as err:
        raise ValueError(f"{MULTI_TURN}.tool_config_path={path}: cannot read it ({err})") from err
    except Exception as err:  # a YAML syntax error
        raise ValueError(f"{MULTI_TURN}.tool_config_path={path}: not a valid YAML file ({err})") from err
    entries = loaded.get("tools") if isinstance(loaded, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: tools must be a list of tool entries (class_name, config, tool_schema)")
    return [(f"{path}: tools[{index}]", _entry_tool(f"{path}: tools[{index}]", entry))
            for index, entry in enumerate(entries)]


def _unique(tools: list[tuple[str, OpenAITool]]) -> list[OpenAITool]:
    first: dict[str, str] = {}
    for where, tool in tools:
        if tool.name in first:
            raise ValueError(f"two tools are named {tool.name!r} (tool_schema.function.name): {first[tool.name]} and "
                             f"{where}; tool names must be unique")
        first[tool.name] = where
    return [tool for _, tool in tools]


def load_tool_yaml(path: str) -> list[OpenAITool]:
    """The tools of a tool YAML (module docstring); a ValueError naming the file, entry and field at fault."""
    return _unique(_yaml_tools(path))


def load_function_tools(path: str) -> list[FunctionTool]:
    """The @function_tool functions of the Python file at `path`."""
    return _unique(_function_tools(path))


def load_all_tools(tool_config_path: str | None = None, function_tool_path: str | None = None) -> list[OpenAITool]:
    """The YAML's tools, then the function tools of the file; a name used twice is an error."""
    tools = _yaml_tools(tool_config_path) if tool_config_path else []
    return _unique(tools + (_function_tools(function_tool_path) if function_tool_path else []))
