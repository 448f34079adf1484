"""The OpenAI function-calling schema of a tool, and what a call returns (verl's `verl.tools.schemas`).

A tool schema as the model sees it in the chat template's tool list::

    {"type": "function",
     "function": {"name": "calculator", "description": "...",
                  "parameters": {"type": "object",
                                 "properties": {"expression": {"type": "string", "description": "..."}},
                                 "required": ["expression"]}}}

The models name the fields verl names. Every other JSON-schema keyword (minimum, items, pattern,
additionalProperties, strict, ...) is kept as given, so `model_validate(raw).model_dump(exclude_unset=True,
exclude_none=True) == raw`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Schema(BaseModel):
    model_config = ConfigDict(extra="allow")  # the JSON-schema keywords the fields do not name pass through


class OpenAIFunctionPropertySchema(_Schema):
    """One parameter. `type` is a JSON type name, or a list of them (`["integer", "null"]` for `int | None`)."""

    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(_Schema):
    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = {}
    required: list[str] = []

    @model_validator(mode="after")
    def _required_are_properties(self) -> OpenAIFunctionParametersSchema:
        missing = [name for name in self.required if name not in self.properties]
        if missing:
            raise ValueError(f"required names {missing}, which are not in properties {sorted(self.properties)}")
        return self


class OpenAIFunctionSchema(_Schema):
    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)


class OpenAIFunctionToolSchema(_Schema):
    type: str = "function"
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as the model wrote it: the arguments still a JSON string."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A call with its arguments decoded."""

    name: str
    arguments: dict[str, Any]


class OpenAIFunctionToolCall(BaseModel):
    """One call in an assistant message's `tool_calls`: its id and the decoded call."""

    id: str
    type: str = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What one call gives back to the model: text, and images or videos for a multimodal model."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None
