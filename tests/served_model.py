"""A real vLLM OpenAI-compatible server of a tiny model on 127.0.0.1, for the tests of the served-model evaluation.

`serve(model_dir, log_path)`: verl/utils/model_server.serve_model with the tiny model's settings (float32, eager, its
context length).
`tool_model(base_dir, out_dir)` is the tiny model after a short cold start on the tool-arithmetic demonstrations,
so that it writes `<python>...</python>` calls and `<answer>` tags: tool rounds happen for real through the server.

Tests import these as `from served_model import serve, tool_model` and start one server per test module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from verl.utils.model_server import STARTUP_TIMEOUT_S, Server, serve_model

MAX_MODEL_LEN = 1024  # the tiny model's max_position_embeddings


@contextlib.contextmanager
def serve(model_dir: str, log_path: str, name: str = "tiny", timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[Server]:
    """A running vLLM server of `model_dir` (float32, eager, 1 GiB of KV cache) until the block ends."""
    with serve_model(model_dir, log_path, name, timeout_s, dtype="float32", max_model_len=MAX_MODEL_LEN) as server:
        yield server


def tool_model(base_dir: str, out_dir: str, steps: int = 150) -> str:
    """The tiny model at `base_dir` after `steps` steps on tool-arithmetic demonstrations (think, a python call, its
    result, the boxed answer), saved to `out_dir`; returns `out_dir`. One torch thread: a model this small trains
    several times faster on one core than on two that other processes share."""
    import torch
    from e2e.e2e_utils import prime_model

    from verl.demo.tool_tasks import make_tool_arithmetic_rows

    rows = make_tool_arithmetic_rows(48, "train")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prime_model(base_dir, out_dir, [(row["prompt"], row["extra_info"]["response"]) for row in rows], steps=steps)
    finally:
        torch.set_num_threads(threads)
    return out_dir
