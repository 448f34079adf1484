"""The tool contract: a name, the tag the model writes around a call, and `execute(content) -> result text`."""

from __future__ import annotations

from abc import ABC, abstractmethod


class ToolError(Exception):
    """A failed call. `retryable=True` marks transient failures (a network error) that another attempt may fix;
    deterministic failures (the model's code raised) are reported once and never re-run."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


class BaseTool(ABC):
    """A tool. The model calls it by writing `<trigger_tag>content</trigger_tag>`; the agent loop stops generation at
    the closing tag (a stop string), runs `execute(content)` and shows the returned text in `<result>` tags."""

    name: str
    trigger_tag: str

    @abstractmethod
    def execute(self, content: str) -> str:
        """The result text of one call; raise ToolError when the call failed."""

    def close(self) -> None:  # noqa: B027 -- optional hook; most tools hold nothing to release
        """Release resources (threads, files); called once when the tool manager closes."""
