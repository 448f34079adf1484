"""verl's `verl.utils.fs`: where a model or data path is read from (`copy_to_local`), on local paths.

verl copies an `hdfs://` source into a local cache first and hands back the local copy; Quiver has no HDFS client,
so an hdfs:// path raises HDFSNotAvailable (verl/utils/hdfs_io.py) and a local path (or a Hugging Face model id) comes
back as it was given. `copy`, `exists` and `makedirs` are hdfs_io's, as in verl.
"""

from __future__ import annotations

import hashlib
import os
import shutil

from verl.utils.hdfs_io import HDFSNotAvailable, check_local, copy, exists, is_non_local, makedirs

__all__ = ["HDFSNotAvailable", "copy", "copy_local_path_from_hdfs", "copy_to_local", "copy_to_shm", "exists",
           "is_non_local", "local_mkdir_safe", "makedirs"]

SHM_CACHE = "/dev/shm/verl-cache"


def copy_to_local(src: str, cache_dir: str | None = None, filelock: str = ".file.lock", verbose: bool = False,
                  always_recopy: bool = False, use_shm: bool = False) -> str:
    """The local path to read `src` from: `src` itself, or with `use_shm` its copy in shared memory (copy_to_shm).
    `cache_dir`, `filelock`, `verbose` and `always_recopy` are verl's HDFS-cache settings and change nothing here."""
    local = copy_local_path_from_hdfs(src, cache_dir, filelock, verbose, always_recopy)
    return copy_to_shm(local) if use_shm else local


def copy_local_path_from_hdfs(src: str, cache_dir: str | None = None, filelock: str = ".file.lock",
                              verbose: bool = False, always_recopy: bool = False) -> str:
    """verl's older name for copy_to_local without shared memory: `src` itself, checked to be local."""
    return check_local(src)


def copy_to_shm(src: str) -> str:
    """A copy of the file or folder `src` under /dev/shm/verl-cache (one folder per absolute source path), made once
    per machine: loading a model many times from memory is faster than from disk. The copy is written under a
    temporary name and renamed when complete, so an interrupted copy is never taken for a finished one."""
    src = os.path.abspath(os.path.expanduser(check_local(src)))
    folder = os.path.join(SHM_CACHE, hashlib.md5(src.encode()).hexdigest())
    dest = os.path.join(folder, os.path.basename(src))
    if os.path.exists(dest):
        return dest
    os.makedirs(folder, exist_ok=True)
    partial = f"{dest}.partial-{os.getpid()}"
    if os.path.isdir(src):
        shutil.copytree(src, partial, dirs_exist_ok=True)
    else:
        shutil.copy2(src, partial)
    try:
        os.rename(partial, dest)
    except OSError:  # a folder: another process finished its copy first (a file is simply replaced)
        shutil.rmtree(partial, ignore_errors=True)
    return dest


def local_mkdir_safe(path: str) -> str:
    """Create the folder `path` (relative to the working directory) if missing, safe when several processes do it at
    once; returns its absolute path."""
    path = os.path.abspath(path)
    os.makedirs(path, exist_ok=True)
    return path
