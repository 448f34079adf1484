"""The driver's half of checkpointing: atomic step directories, the `latest` marker, retention and discovery.

A checkpoint is written into a hidden temporary directory and renamed to `global_step_N` only once every file is
complete, and `latest_checkpointed_iteration.txt` is replaced atomically afterwards. A run killed mid-save therefore
leaves at most a `.tmp-*` directory, which resume ignores (and the next save removes).
"""

from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager

LATEST_FILE = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
TMP_PREFIX = ".tmp-global_step_"


def _fsync_tree(path: str) -> None:
    """Flush every file under `path` to disk, so a rename never publishes data still in the page cache."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def step_dirs(root: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    if not os.path.isdir(root):
        return []
    found = [(int(m.group(1)), os.path.join(root, name))
             for name in os.listdir(root) if (m := STEP_DIR.match(name))]
    return sorted(found)


def find_latest_ckpt_path(root: str) -> str | None:
    """The newest complete checkpoint: the one the `latest` file names, else the highest global_step_N dir."""
    root = os.path.expanduser(root)
    latest = os.path.join(root, LATEST_FILE)
    if os.path.exists(latest):
        with open(latest) as f:
            text = f.read().strip()
        path = os.path.join(root, f"global_step_{text}")
        if text.isdigit() and os.path.isdir(path):
            return path
        print(f"[checkpoint] {latest} names step {text!r}, which has no complete checkpoint; scanning instead")
    dirs = step_dirs(root)
    return dirs[-1][1] if dirs else None


@contextmanager
def atomic_step_dir(root: str, step: int):
    """Yield a temporary directory to fill; on success it becomes `root/global_step_{step}` and the latest marker."""
    root = os.path.expanduser(root)
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):  # leftovers of saves that were killed
        if name.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    tmp = os.path.join(root, f"{TMP_PREFIX}{step}-{os.getpid()}")
    os.makedirs(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_tree(tmp)
    final = os.path.join(root, f"global_step_{step}")
    if os.path.exists(final):  # saving the same step again (e.g. after a resume): replace it
        old = f"{final}.old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _write_atomic(os.path.join(root, LATEST_FILE), str(step))


def remove_old_checkpoints(root: str, keep: int | None) -> list[str]:
    """Delete all but the newest `keep` checkpoints (None or <= 0 keeps everything); returns what was removed."""
    if not keep or keep <= 0:
        return []
    removed = [path for _step, path in step_dirs(os.path.expanduser(root))[:-keep]]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
