"""A SandboxFusion server as the sandbox of the code reward (`reward_model.sandbox_fusion.url`, verl's key).

The program and its files go to the server's `run_code` endpoint in one JSON request (`code`, `language`,
`run_timeout`, `memory_limit_MB`, `files` as base64 text); its answer (`status`, `run_result` with `status`,
`return_code`, `stdout`, `stderr`, `execution_time`) becomes the same `SandboxResult` the local sandbox returns, so
the code reward grades alike on both. A server that cannot be reached, answers with an HTTP error or reports its own
failure gives status "sandbox_error", never an exception: one bad request must not stop a training step.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from contextlib import nullcontext
from typing import Any

from verl.utils.sandbox import SandboxLimits, SandboxResult

ENDPOINT = "run_code"
# Seconds the HTTP request may take beyond the program's own time limit (queueing, start-up, transfer).
_REQUEST_MARGIN_S = 30.0


def run_code_url(url: str) -> str:
    """The run_code endpoint of a server given by its base URL or by the endpoint itself."""
    url = url.rstrip("/")
    return url if url.endswith("/" + ENDPOINT) else f"{url}/{ENDPOINT}"


def run_python_remote(url: str, code: str, limits: SandboxLimits, files: dict[str, str] | None = None,
                      stdin: str | None = None, semaphore: Any = None) -> SandboxResult:
    """Run `code` as a python program with `files` beside it (and `stdin` as its input) on the SandboxFusion server
    at `url`. `semaphore` (a multiprocessing Manager's, shared by the grading processes): held while the request is
    in flight, so at most `reward_model.sandbox_fusion.max_concurrent` requests reach the server at once."""
    payload = {"code": code, "language": "python", "run_timeout": limits.wall_time_s,
               "memory_limit_MB": limits.memory_mb,
               "files": {name: base64.b64encode(text.encode()).decode() for name, text in (files or {}).items()}}
    if stdin is not None:
        payload["stdin"] = stdin
    request = urllib.request.Request(run_code_url(url), data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with semaphore or nullcontext(), urllib.request.urlopen(request, timeout=limits.wall_time_s + _REQUEST_MARGIN_S) as response:
            answer = json.loads(response.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as err:
        return _failed(f"SandboxFusion answered HTTP {err.code} at {run_code_url(url)}", start)
    except (OSError, ValueError) as err:  # unreachable, timed out, reset, or not JSON
        return _failed(f"SandboxFusion request to {run_code_url(url)} failed: {type(err).__name__}: {err}", start)
    run = answer.get("run_result") if isinstance(answer, dict) else None
    if not isinstance(run, dict) or answer.get("status") == "SandboxError":
        return _failed(f"SandboxFusion could not run the program: {str(answer)[:300]}", start)
    stdout, stderr = str(run.get("stdout") or ""), str(run.get("stderr") or "")
    returncode = run.get("return_code")
    if run.get("status") == "TimeLimitExceeded":
        status = "timeout"
    elif len(stdout.encode()) > limits.max_output_bytes:
        status, stdout = "output_limit", stdout.encode()[: limits.max_output_bytes].decode("utf-8", "ignore")
    else:
        status = "ok" if run.get("status") == "Finished" and returncode == 0 else "runtime_error"
    elapsed = run.get("execution_time")
    return SandboxResult(status, returncode, stdout, stderr,
                         float(elapsed) if elapsed is not None else time.monotonic() - start)


def _failed(message: str, start: float) -> SandboxResult:
    return SandboxResult("sandbox_error", None, "", message, time.monotonic() - start)
