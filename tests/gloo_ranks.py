"""Ranks that a test starts (a gloo group): how they start (`spawn`) and how they leave when their work went well
(`leave_group`)."""

import multiprocessing
import os
import sys

import torch.distributed as dist
import torch.multiprocessing

# What the fork server imports once for a test worker's ranks; each rank is then a fork of it.
FORK_SERVER_PRELOAD = ["torch", "torch.distributed.fsdp", "transformers", "tensordict", "verl.utils.fsdp_utils"]


def fork_server_context():
    """The multiprocessing context whose processes are forks of a fork server that has imported FORK_SERVER_PRELOAD
    (started at the first process of a test worker, kept until the worker exits). A spawned rank imported torch,
    transformers and Quiver again: about 4 CPU-s a rank, 30 ranks a suite. Its processes start as spawned ones do
    (the target and its arguments pickled, nothing of the test worker's state but those imports), except for the
    environment, which is the server's: start targets through `in_environment` to give them the test's."""
    multiprocessing.set_forkserver_preload(FORK_SERVER_PRELOAD)
    return torch.multiprocessing.get_context("forkserver")


def in_environment(rank: int, environment: dict, rank_fn, *args) -> None:
    """Run `rank_fn(rank, *args)` under `environment` (the test's `os.environ` when it started the rank)."""
    os.environ.clear()
    os.environ.update(environment)
    rank_fn(rank, *args)


def spawn(rank_fn, args: tuple = (), nprocs: int = 1) -> None:
    """`torch.multiprocessing.spawn(rank_fn, args, nprocs, join=True)` with the ranks started by
    `fork_server_context` in the test's environment: `rank_fn(rank, *args)` in each; a rank's error is raised here."""
    fork_server_context()
    torch.multiprocessing.start_processes(in_environment, args=(dict(os.environ), rank_fn, *args), nprocs=nprocs,
                                          join=True, start_method="forkserver")


def run_ranks_to_files(rank_fn, out_dir, deadline_s: float, nprocs: int = 2) -> list:
    """Start `rank_fn(rank, port, out_dir)` on `nprocs` ranks (`fork_server_context`, the test's environment), wait
    up to `deadline_s` for them, and load what each saved as `<out_dir>/rank<r>.pt`; fails the test, naming the
    ranks, when one hung or saved nothing."""
    import torch

    from verl.single_controller.base.worker import find_free_port

    context = fork_server_context()
    port = find_free_port()
    ranks = [context.Process(target=in_environment, args=(rank, dict(os.environ), rank_fn, port, str(out_dir)))
             for rank in range(nprocs)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(deadline_s)
    hung = [process for process in ranks if process.is_alive()]
    for process in hung:
        process.kill()
        process.join()
    assert not hung, f"the {nprocs}-rank run did not finish within {deadline_s} s"
    missing = [rank for rank in range(nprocs) if not (out_dir / f"rank{rank}.pt").exists()]
    assert not missing, f"ranks {missing} saved no results (exit codes {[process.exitcode for process in ranks]})"
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(nprocs)]


def leave_group() -> None:
    """Wait until the other ranks are done with the group, then end this process without gloo's C++ teardown.

    Under load, that teardown (`destroy_process_group`, or the interpreter's exit after it) now and then aborted one
    rank (SIGABRT, "terminate called without an active exception"), on torch 2.11 and 2.13 alike. The ranks of these
    tests report through a Manager dict or files, written by then. A rank that failed reports its error and leaves with
    `destroy_process_group`; the barrier then fails here, and this rank leaves all the same, so that the test shows
    the failed rank's error.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        dist.barrier()
    except Exception:  # a failed rank left first: its report is what the test reads
        pass
    os._exit(0)
