"""One rollout engine for all the ranks of a single CPU node.

Decoding reads every weight of the model once per generated token whatever the batch size, and on a CPU the ranks
of one node share the memory bandwidth that reading takes. One engine per rank therefore reads the model once per
rank per token; one engine that decodes the prompts of every rank together, with all of the node's cores, reads it
once. At the Qwen2.5-0.5B shape on 2 cores this halves the generation time and saves one copy of the model (see
benchmarks/README.md).

`NodeSharedEngine` wraps the engine of rank 0 (the other ranks hold none). Each rank keeps calling the worker's
`run_in_tp_group` with its own prompts, as with one engine per rank: rank 0 gathers every rank's prompts, generates
for all of them with the threads of every rank, and scatters each rank's results back, while the other ranks wait in
the scatter (a gloo wait sleeps; it takes no CPU). Weight pushes gather the actor's shards on rank 0 only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from verl.workers.rollout.base import CompletionOutput, RolloutEngine, SamplingParams

LEADER = 0


class NodeSharedEngine(RolloutEngine):
    """The engine on rank 0 (`engine`; None on the other ranks), shared by every rank of the process group.

    threads: torch threads rank 0 uses while it generates (the cores of all ranks); restored afterwards.
    """

    # Every rank joins the gather of an in-place push (the others only send their shards): rank 0's engine is an HF
    # engine (rollout.share_cpu_engine), which takes the weights in place.
    takes_weights_in_place = True

    def __init__(self, engine: RolloutEngine | None, threads: int):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if (engine is None) != (self.rank != LEADER):
            raise ValueError(f"NodeSharedEngine: rank {LEADER} must hold the engine and no other rank may (rank "
                             f"{self.rank} {'has' if engine is not None else 'has no'} engine)")
        self.engine = engine
        self.threads = threads

    @property
    def leads(self) -> bool:
        return self.engine is not None

    @property
    def push_destination(self) -> int:
        """The rank whose engine receives the weights."""
        return LEADER

    @property
    def weights_released(self) -> bool:
        return bool(self.leads and self.engine.weights_released)

    # ---- generation -------------------------------------------------------------------------------------------

    def run_in_tp_group(self, local: Any, work: Callable[[list[Any]], list[Any]]) -> Any:
        """`work` on rank 0 over the items of every rank (in rank order); each rank gets its own result back. An
        exception on rank 0 is raised on every rank."""
        items = [None] * self.world_size if self.leads else None
        dist.gather_object(local, items, dst=LEADER)
        results, failure = None, None
        if self.leads:
            threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                results = work(items)
            except Exception as err:  # the other ranks must hear of it, or they would wait for ever
                failure = err
                results = [_Failure(f"{type(err).__name__}: {err}")] * self.world_size
            finally:
                torch.set_num_threads(threads)
        mine = [None]
        dist.scatter_object_list(mine, results, src=LEADER)
        if failure is not None:
            raise failure
        if isinstance(mine[0], _Failure):
            raise RuntimeError(f"the rollout engine shared by this node's ranks (on rank {LEADER}) failed: "
                               f"{mine[0].message}")
        return mine[0]

    def generate(self, prompt_token_ids: list[list[int]],
                 params: SamplingParams | list[SamplingParams]) -> list[list[CompletionOutput]]:
        if not self.leads:
            raise RuntimeError(f"rank {self.rank} holds no rollout engine: this node's engine is on rank {LEADER} "
                               f"(generate through run_in_tp_group)")
        return self.engine.generate(prompt_token_ids, params)

    # ---- weights and memory -----------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Rank 0 loads the weights; the other ranks still walk the stream, whose gathers are collectives."""
        if self.leads:
            self.engine.update_weights(named_tensors)
        else:
            for _ in named_tensors:
                pass

    def weight_targets(self) -> dict[str, torch.Tensor] | None:
        """Rank 0's engine tensors to write the weights into (see HFRollout.weight_targets); None elsewhere."""
        return self.engine.weight_targets() if self.leads else None

    def check_all_written(self, written: set[str]) -> None:
        if self.leads:
            self.engine.check_all_written(written)

    def sleep(self) -> None:
        if self.leads:
            self.engine.sleep()

    def wake_up(self) -> None:
        if self.leads:
            self.engine.wake_up()

    def weights_checksum(self) -> float:
        """Rank 0's engine checksum, on every rank (a collective)."""
        box = [self.engine.weights_checksum() if self.leads else None]
        dist.broadcast_object_list(box, src=LEADER)
        return box[0]

class _Failure:
    def __init__(self, message: str):
        self.message = message
