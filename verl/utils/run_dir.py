"""A run owns its directory (`trainer.default_local_dir`): one run at a time, and no run silently mixes its
checkpoints and metrics with an earlier run's.

`own_run_dir` takes an OS file lock on `<dir>/run.lock` (filelock: `flock` on Linux) for as long as the run lasts,
and writes `<dir>/run_owner.json` (host, pid, start time, command) beside it. The operating system drops the lock
when the process ends however it ends, so a killed run never leaves the directory stuck; a second run finds the lock
taken, reads the owner file and refuses to start, naming the first. The owner file goes when the run ends normally;
one left by a killed run is replaced by the next owner.

`check_fresh_start` refuses a run that would start from scratch (`trainer.resume_mode=disable`, or `auto` finding
metrics but no checkpoint) in a directory holding an earlier run's output, unless `trainer.overwrite=true`;
`clear_run_outputs` then deletes that output, once the new run has really started.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from contextlib import contextmanager

from filelock import FileLock, Timeout

from verl.utils.checkpoint.checkpoint_manager import LATEST_FILE, TMP_PREFIX, step_dirs, write_atomic
from verl.utils.config import ConfigError
from verl.utils.tracking import METRICS_FILE

LOCK_FILE = "run.lock"
OWNER_FILE = "run_owner.json"
# What a PPO run writes into its directory (and overwrite=true deletes), by name prefix: checkpoints and their
# temporary and replaced copies, the latest marker, the metrics, the resolved config and memory estimate, RLPR's scoreA,
# the loggers' dirs.
RUN_OUTPUTS = (
    "global_step_",
    TMP_PREFIX,
    LATEST_FILE,
    METRICS_FILE,
    "config.yaml",
    "memory_estimate.json",
    "run_plan.json",
    "scoreA.json",
    "wandb",
    "tensorboard",
)


def _describe(owner: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("start_time", 0)))
    return f"pid {owner.get('pid')} on {owner.get('host')}, started {started} ({owner.get('command', '?')})"


def _read_owner(path: str) -> dict | None:
    try:
        with open(os.path.join(path, OWNER_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@contextmanager
def own_run_dir(path: str):
    """Hold the lock of run directory `path` (created if need be) inside the block; a ConfigError when another
    live process holds it, naming that process."""
    path = os.path.abspath(os.path.expanduser(path))
    lock = FileLock(os.path.join(path, LOCK_FILE), timeout=0)
    try:
        os.makedirs(path, exist_ok=True)
        lock.acquire()
    except Timeout:
        owner = _read_owner(path)
        holder = _describe(owner) if owner else "a process that has not written its run_owner.json yet"
        raise ConfigError(
            f"trainer.default_local_dir={path} is in use by another run: {holder}. Two runs in one directory would "
            "interleave their metrics and overwrite each other's checkpoints. Wait for that run to end (or stop it), "
            "or give this run its own directory (trainer.default_local_dir, or trainer.experiment_name)"
        ) from None
    except OSError as e:
        raise ConfigError(
            f"trainer.default_local_dir={path} cannot be written ({e.strerror}): choose a directory "
            "this user can write to"
        ) from e
    try:
        previous = _read_owner(path)
        if previous and previous.get("pid") != os.getpid():
            print(
                f"[quiver] {path}: the previous run ({_describe(previous)}) ended without releasing the directory "
                "(killed?); this run takes it over"
            )
        owner = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start_time": time.time(),
            "command": " ".join(sys.argv),
        }
        write_atomic(os.path.join(path, OWNER_FILE), json.dumps(owner, indent=1))
        yield path
    finally:
        try:
            os.remove(os.path.join(path, OWNER_FILE))
        except FileNotFoundError:
            pass
        lock.release()


def run_outputs(path: str) -> list[str]:
    """The names in run directory `path` that an earlier run wrote (see RUN_OUTPUTS), sorted."""
    if not os.path.isdir(path):
        return []
    return sorted(name for name in os.listdir(path) if name.startswith(RUN_OUTPUTS))


def check_fresh_start(path: str, resume_mode: str, overwrite: bool) -> None:
    """Refuse (ConfigError) a run that would start from scratch over an earlier run's checkpoints or metrics.

    From scratch means `resume_mode=disable`, or `auto` in a directory with metrics but no checkpoint to resume.
    `overwrite=true` allows it with `resume_mode=disable` (the output is deleted once the run starts).
    """
    path = os.path.abspath(os.path.expanduser(path))
    checkpoints = [os.path.basename(p) for _step, p in step_dirs(path)]
    has_metrics = os.path.exists(os.path.join(path, METRICS_FILE))
    if resume_mode == "disable" and (checkpoints or has_metrics) and not overwrite:
        held = ", ".join(checkpoints[-3:] + [METRICS_FILE] * has_metrics)
        raise ConfigError(
            f"trainer.resume_mode=disable would start a new run in trainer.default_local_dir={path}, which holds an "
            f"earlier run ({held}); its metrics and checkpoints would be mixed with this run's. Add "
            "trainer.overwrite=true to delete them first, use trainer.resume_mode=auto to continue that run, or "
            "give this run another directory"
        )
    if resume_mode == "auto" and has_metrics and not checkpoints:
        raise ConfigError(
            f"trainer.default_local_dir={path} holds the metrics of an earlier run but no checkpoint to resume "
            "from (trainer.save_freq), so this run would start from scratch and append to them. Add "
            "trainer.resume_mode=disable trainer.overwrite=true to delete them and start over, or give this run "
            "another directory"
        )


def clear_run_outputs(path: str) -> list[str]:
    """Delete what an earlier run wrote into `path` (checkpoints, metrics, ...; never the lock); returns the names."""
    path = os.path.abspath(os.path.expanduser(path))
    removed = run_outputs(path)
    for name in removed:
        target = os.path.join(path, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        else:
            os.remove(target)
    if removed:
        print(f"[quiver] trainer.overwrite=true: deleted {', '.join(removed)} from {path}")
    return removed
