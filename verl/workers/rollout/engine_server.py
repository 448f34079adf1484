"""The server of verl's agent loops (`rollout.mode=async`): `EngineServer`, the loops' `server_manager`, batches the
requests of a batch's concurrent loops into one rollout engine.

Requests wait in one queue. A batch goes to the engine when every loop still running is waiting on it, or when no
new request came for `BATCH_WINDOW_S` while some loops are busy elsewhere (in a tool call); the first batch of a call
also waits (up to `FIRST_REQUEST_WAIT_S`) for every loop to ask once. The engine runs in the calling thread while the
loops go on in `agent.num_workers` threads, each with its own event loop: one loop's tool call runs while the others
decode, and a loop written with blocking code stalls only its own thread. A batch reaches the engine in row order,
so with plain sampling it is the same engine call as `mode=sync` makes, and the same seed gives the same samples.
Requests whose sampling differs in more than `max_tokens` go in separate engine calls (the HF engine samples one way
per call). vLLM (an engine of one rank) batches continuously instead, as verl's async vLLM server does: each request
joins the running batch when it comes and its loop resumes the step it finishes (`EngineServer._stream`;
`VLLMRollout.add_request` / `step` over vLLM's engine), so no loop waits for a batch to end; its samples then depend
on the timing of the tool calls.

Each loop's coroutine runs with its `LoopState` in `CURRENT_LOOP` (set by the manager, agent_loops.py): the row it
orders its requests by, and whether it has asked yet.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from verl.workers.rollout.agent_loop_api import TokenOutput
from verl.workers.rollout.base import RolloutEngine, SamplingParams

BATCH_WINDOW_S = 0.01
FIRST_REQUEST_WAIT_S = 2.0


@dataclass
class LoopState:
    """One running loop: the row its requests are ordered by, whether it has asked yet, how many it has made, and
    per completion it got (in order) the policy version that sampled it and how many tokens it had."""

    row: int
    asked: bool = False
    requests: int = 0
    completions: list[tuple[int | None, int]] = field(default_factory=list)


CURRENT_LOOP: contextvars.ContextVar[LoopState | None] = contextvars.ContextVar("agent_loop", default=None)


@dataclass
class _Request:
    order: tuple[int, int]
    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future
    state: LoopState | None = None

    def answer(self, out) -> None:
        """Give the loop the engine's completion, recorded in its LoopState."""
        if self.state is not None:
            self.state.completions.append((out.policy_version, len(out.token_ids)))
        self.future.set_result(_token_output(out))


def _token_output(out) -> TokenOutput:
    """A loop's TokenOutput of an engine's CompletionOutput."""
    return TokenOutput(token_ids=list(out.token_ids), log_probs=list(out.log_probs), entropies=list(out.entropies),
                       finish_reason=out.finish_reason, stop_reason=out.stop_reason, top_log_probs=out.top_log_probs,
                       policy_version=out.policy_version)


class EngineServer:
    """The loops' `server_manager` over one `RolloutEngine` (module docstring). `base` is the call's sampling (the
    rollout config's or validation's); a loop's `sampling_params` dict overrides temperature, top_p, top_k,
    max_tokens (null: `response_length`), stop and stop_token_ids."""

    def __init__(self, engine: RolloutEngine, base: SamplingParams, response_length: int):
        self.engine, self.base, self.response_length = engine, base, response_length
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._running = 0  # loops not finished
        self._fresh = 0  # loops that have not asked yet
        self._holders = 0  # branching groups that may still start loops
        self.batch_sizes: list[int] = []

    async def generate(self, request_id: str | None = None, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any] | None = None, image_data=None, **_: Any) -> TokenOutput:
        """Sample one completion of `prompt_ids` (verl's signature; `request_id` is only a label here)."""
        if image_data:
            raise NotImplementedError("image inputs: vision-language rollouts are not built in Quiver")
        params = self.sampling(sampling_params or {})
        state = CURRENT_LOOP.get()
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if state is not None:
                if not state.asked:
                    state.asked = True
                    self._fresh -= 1
                state.requests += 1
            order = (state.row, state.requests) if state is not None else (1 << 62, len(self._pending))
            self._pending.append(_Request(order, [int(t) for t in prompt_ids], params, future, state))
            self._cond.notify_all()
        return await asyncio.wrap_future(future)

    def sampling(self, overrides: dict[str, Any]) -> SamplingParams:
        """The engine's SamplingParams of one request."""
        known = {}
        for key in ("temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "do_sample"):
            if overrides.get(key) is not None:
                known[key] = overrides[key]
        if "max_new_tokens" in overrides and "max_tokens" not in known:
            known["max_tokens"] = overrides["max_new_tokens"]
        known.setdefault("max_tokens", self.response_length)
        known["max_tokens"] = max(1, int(known["max_tokens"]))
        if known.get("top_k") is not None:
            known["top_k"] = int(known["top_k"])
        return replace(self.base, n=1, logprobs=overrides.get("top_logprobs"), **known)

    # ------------------------------------------------------------------ the loops' side of the bookkeeping
    def _begin(self, count: int) -> None:
        with self._cond:
            self._running += count
            self._fresh += count

    def _finish(self, state: LoopState) -> None:
        with self._cond:
            self._running -= 1
            if not state.asked:
                self._fresh -= 1
            self._cond.notify_all()

    def _hold(self) -> None:
        with self._cond:
            self._holders += 1

    def _release(self) -> None:
        with self._cond:
            self._holders -= 1
            self._cond.notify_all()

    # ------------------------------------------------------------------ the engine's side
    def serve(self, alive: Callable[[], bool] = lambda: True) -> None:
        """Run batches until every loop has finished (in the thread that owns the engine), or until `alive()` says
        the threads running the loops are gone (a crash outside any loop: nothing would ask again). An engine that
        streams (`streams`, vLLM's) takes each request as it comes instead (`_stream`)."""
        if self.engine.streams:
            return self._stream(alive)
        first_deadline = time.monotonic() + FIRST_REQUEST_WAIT_S
        while True:
            with self._cond:
                while not self._pending and (self._running > 0 or self._holders > 0):
                    if not self._cond.wait(timeout=1.0) and not alive():
                        return
                if not self._pending:
                    return
                while len(self._pending) < self._running:
                    if self._fresh > 0 and time.monotonic() < first_deadline:
                        self._cond.wait(max(first_deadline - time.monotonic(), 0.0))
                        continue
                    count = len(self._pending)
                    self._cond.wait(BATCH_WINDOW_S)
                    if len(self._pending) == count:
                        break
                batch = sorted(self._pending, key=lambda r: r.order)
                self._pending = []
            self._run(batch)

    def _stream(self, alive: Callable[[], bool]) -> None:
        """Continuous batching: each request joins the engine's running batch as soon as it comes (`add_request`),
        the engine steps while any is unfinished (`step`), and each loop gets its completion the step it finishes,
        so a loop back from a tool call never waits for a batch to end. `batch_sizes` holds the requests running at
        each engine step."""
        in_flight: dict[str, _Request] = {}
        while True:
            with self._cond:
                while not self._pending and not in_flight and (self._running > 0 or self._holders > 0):
                    if not self._cond.wait(timeout=1.0) and not alive():
                        return
                if not self._pending and not in_flight:
                    return
                arrived = sorted(self._pending, key=lambda r: r.order)
                self._pending = []
            for request in arrived:
                try:
                    in_flight[self.engine.add_request(request.prompt_ids, request.params)] = request
                except Exception as err:  # this request's loop gets the engine's error
                    request.future.set_exception(err)
            if not in_flight:
                continue
            self.batch_sizes.append(len(in_flight))
            try:
                finished = self.engine.step()
            except Exception as err:  # every running request's loop gets the engine's error
                for request in in_flight.values():
                    request.future.set_exception(err)
                in_flight.clear()
                continue
            for request_id, out in finished:
                in_flight.pop(request_id).answer(out)

    def _run(self, batch: list[_Request]) -> None:
        self.batch_sizes.append(len(batch))
        groups: dict[str, list[_Request]] = {}
        for request in batch:  # one engine call per sampling (max_tokens aside), in row order
            groups.setdefault(repr(replace(request.params, max_tokens=1)), []).append(request)
        for requests in groups.values():
            try:
                outputs = self.engine.generate([r.prompt_ids for r in requests], [r.params for r in requests])
            except Exception as err:  # every loop of the call gets the engine's error
                for r in requests:
                    r.future.set_exception(err)
                continue
            for r, (out, *_) in zip(requests, outputs):
                r.answer(out)
