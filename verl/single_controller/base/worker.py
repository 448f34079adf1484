"""The base class of every remote worker: it knows its rank and can join the torch.distributed group."""

from __future__ import annotations

import os
import random
import socket

# torch.distributed backend per device; on CUDA, gloo stays available so CPU tensors can be reduced too.
BACKENDS = {"cpu": "gloo", "cuda": "cpu:gloo,cuda:nccl"}


# Ports are picked from here up to the start of the kernel's ephemeral range (Ray's worker ports end at 19999).
PORT_RANGE_START = 20000


def find_free_port() -> int:
    """A TCP port that is free right now, picked at random below the kernel's ephemeral range where possible. The
    kernel hands ephemeral ports to outgoing connections on its own, so a port taken from there (bind to port 0)
    can be in use by the time rank 0 listens on it: a test run saw gloo's rendezvous fail with EADDRINUSE that way."""
    low = _ephemeral_range_start()
    rng = random.Random()
    for _ in range(64):
        port = rng.randrange(PORT_RANGE_START, low) if low - PORT_RANGE_START >= 1000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return s.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _ephemeral_range_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def get_node_ip_and_free_port() -> tuple[str, int]:
    """The IP of the Ray node this runs on and a TCP port that is free on it right now (for MASTER_ADDR/PORT)."""
    import ray

    return ray.util.get_node_ip_address(), find_free_port()


class Worker:
    """Reads the rank layout that `RayWorkerGroup` puts in the environment.

    Outside a worker group (a plain process) it is rank 0 of a world of size 1. On GPU, Ray shows each actor only
    its own GPU, so a rank's device is ``cuda:0`` whatever its ``local_rank``.
    """

    def __init__(self):
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.master_addr = os.environ.get("MASTER_ADDR")
        self.master_port = os.environ.get("MASTER_PORT")

    @property
    def batch_device(self):
        """Where this worker computes, and so where the device door (decorator.py) puts the batches it is given:
        the rank's GPU when ``self.device`` is "cuda" (Ray shows each rank only its own), else the CPU."""
        import torch

        if getattr(self, "device", "cpu") == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def init_process_group(self, device: str = "cpu") -> None:
        """Joins the default torch.distributed group (gloo on CPU, NCCL + gloo on CUDA); a no-op when already in."""
        import torch.distributed as dist

        if dist.is_initialized():
            return
        if device not in BACKENDS:
            raise ValueError(f"device must be one of {sorted(BACKENDS)}, got {device!r}")
        if self.world_size == 1 and not self.master_addr:
            # a single process outside a worker group still needs a rendezvous address for env://
            self.master_addr, self.master_port = "127.0.0.1", str(find_free_port())
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = self.master_addr, self.master_port
        if not self.master_addr or not self.master_port:
            raise RuntimeError(
                f"rank {self.rank}: MASTER_ADDR/MASTER_PORT are not set; workers get them from RayWorkerGroup"
            )
        dist.init_process_group(
            backend=BACKENDS[device], init_method="env://", rank=self.rank, world_size=self.world_size
        )
