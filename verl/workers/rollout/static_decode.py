"""The HF engine's static decode loop (hf_rollout.HFRollout, `rollout.static_decode`): whether it runs, and the state it
keeps per batch shape -- transformers' StaticCache and the loop's device buffers, at fixed addresses so that on CUDA
the compiled decode step (a CUDA graph) reads them where it was captured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

# The static loop asks whether every row is done once every this many steps (a host sync each time).
STATIC_DONE_CHECK = 16
# The static loop keeps this many KV caches, one per batch shape: a run's rollouts and its validation each keep theirs
# (and with it the addresses their CUDA graph was captured with: a new cache means recording the graph again, which
# torch allows 128 times per graph before it stops using graphs).
STATIC_CACHES_KEPT = 2
# Why a row of the static loop finished, in _finished's order of precedence.
RUNNING, EOS, STOP_TOKEN, LENGTH = 0, 1, 2, 3


@dataclass
class StaticState:
    """The static loop's device buffers for one batch shape `(rows, length)`: kept with its KV cache and reset for
    each batch, so that they keep the addresses the compiled step was captured with (each is marked static for
    torch.compile: mutated in place, never copied in)."""

    tokens: torch.Tensor  # (rows, length) long: column t = each row's token of step t
    log_probs: torch.Tensor  # (rows, length) float32
    entropies: torch.Tensor  # (rows, length) float32
    mask: torch.Tensor  # (rows, length) long: the attention mask, prompt and response
    position_ids: torch.Tensor  # (rows, 1) long: the newest token's position
    prompt_len: torch.Tensor  # () long: the padded prompt's length (the mask column of step 0's token)
    step: torch.Tensor  # () long: the newest token's column
    last: torch.Tensor  # (rows,) long: each row's max_tokens - 1
    reason: torch.Tensor  # (rows,) long: RUNNING, or why the row ended
    end: torch.Tensor  # (rows,) long: the column of the row's last token
    diverged: torch.Tensor  # () bool: a sampled token's log-prob was NaN
    uniforms: torch.Tensor  # (length, rows, 1) float32: step t's random numbers at [t] (sampling only)
    stop_kinds: torch.Tensor | None = None  # (vocab,) long: per token id, the reason it ends a row (_stop_kinds)
    # GraphedStep's CUDA graphs of the step over these buffers (and their slot's cache), per sampling setting
    graphs: dict = field(default_factory=dict)

    @classmethod
    def allocate(cls, rows: int, length: int, device: torch.device) -> StaticState:
        def new(*shape: int, dtype=torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        state = cls(new(rows, length), new(rows, length, dtype=torch.float32), new(rows, length, dtype=torch.float32),
                    new(rows, length), new(rows, 1), new(), new(), new(rows), new(rows), new(rows),
                    new(dtype=torch.bool), new(length, rows, 1, dtype=torch.float32))
        state._mark_static()
        return state

    def start(self, prompt_len: int, position_ids: torch.Tensor, max_tokens: list[int],
              stop_kinds: torch.Tensor) -> None:
        """Reset for a batch whose prompts were just prefilled: `position_ids` `(rows, 1)` = their last positions."""
        self.prompt_len.fill_(prompt_len)
        self.position_ids.copy_(position_ids)
        self.step.zero_()
        self.last.copy_(torch.tensor(max_tokens, dtype=torch.long) - 1)
        self.reason.fill_(RUNNING)
        self.end.fill_(max(max_tokens) - 1)
        self.diverged.fill_(False)
        if self.stop_kinds is None or self.stop_kinds.shape != stop_kinds.shape:
            self.stop_kinds = torch.empty_like(stop_kinds)
            self._mark_static()
            self.graphs.clear()  # they read the old buffer
        self.stop_kinds.copy_(stop_kinds)

    def _mark_static(self) -> None:
        for tensor in vars(self).values():
            if isinstance(tensor, torch.Tensor):
                torch._dynamo.mark_static_address(tensor)


@dataclass
class StaticSlot:
    """What the static loop keeps per batch shape: the KV cache (transformers' StaticCache) and the loop's state."""

    cache: object
    state: StaticState


_WARMED = "warmed"  # GraphedStep: the setting's step ran once eagerly; the next call captures it


def _warm_on_side_stream(run: Callable[[], None]) -> None:
    """Run the step eagerly on a side stream, as torch.cuda.graph asks of the warm-up before a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)


def _capture_cuda_graph(graph, run: Callable[[], None]) -> None:
    with torch.cuda.graph(graph):
        run()


class GraphedStep:
    """The static loop's step `(state, cache, greedy, temperature, top_k, top_p)` replayed as CUDA graphs captured from
    its eager code, without torch.compile: exact mode's engine on CUDA (`rollout.exact`), whose step must run the very
    kernels the actor's eager forward runs. Inductor would fuse the elementwise ops around them and round otherwise,
    and torch.compile's plain "cudagraphs" backend functionalizes the step first, so that each token's in-place
    write into the KV cache would become a copy of every layer's whole cache (and a second one back).

    Per `state` (one batch shape's buffers and cache, whose addresses the graph reads) and sampling setting (plain
    values baked into the graph): the first call runs the step eagerly, on a side stream (the warm-up: Triton
    compiles its kernels, the allocator sees the step's temporaries); the second captures it and replays the graph
    (a capture records the kernels without running them); later calls replay. The step must not read the device
    from the host (tests/utils/exact_triton_checks.py checks the exact model's step on the Triton route). `new_graph`,
    `warm` and `capture` are torch.cuda's unless a test hands stand-ins."""

    def __init__(self, step: Callable[..., None], new_graph: Callable[[], object] | None = None,
                 warm: Callable[[Callable[[], None]], None] | None = None,
                 capture: Callable[[object, Callable[[], None]], None] | None = None):
        self.step = step
        self.new_graph = new_graph or torch.cuda.CUDAGraph
        self.warm = warm or _warm_on_side_stream
        self.capture = capture or _capture_cuda_graph
        self.captured = 0  # graphs captured so far

    def __call__(self, state: StaticState, cache, greedy: bool, temperature: float, top_k: int,
                 top_p: float) -> None:
        key = (bool(greedy), float(temperature), int(top_k), float(top_p))
        graph = state.graphs.get(key)
        if graph is None:
            self.warm(partial(self.step, state, cache, greedy, temperature, top_k, top_p))
            state.graphs[key] = _WARMED
            return
        if graph is _WARMED:
            graph = self.new_graph()
            self.capture(graph, partial(self.step, state, cache, greedy, temperature, top_k, top_p))
            state.graphs[key] = graph
            self.captured += 1
        graph.replay()


def uses_static_decode(static_decode: bool | None, device_type: str, varying_batches: bool = False) -> bool:
    """Whether the HF engine decodes with the static loop: `rollout.static_decode`, where null means on CUDA only,
    and not for `varying_batches` (verl's async agent loops hand the engine whatever requests are pending, so nearly
    every call would have a new shape, and each new shape compiles its graph again). The run plan decides it
    (`RunPlan.rollout.static_decode`, which the memory estimate reads) and the workers hand the engine its answer; an
    engine built on its own asks this with its device."""
    if static_decode is None:
        return device_type == "cuda" and not varying_batches
    return bool(static_decode)
