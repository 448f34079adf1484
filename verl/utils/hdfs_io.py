"""verl's `verl.utils.hdfs_io`: `copy`, `makedirs` and `exists` as verl's data scripts call them, on local paths.

verl's scripts write their parquet files locally and then, given `--hdfs_dir`, run `makedirs(hdfs_dir)` and
`copy(src=local_dir, dst=hdfs_dir)`. Quiver has no HDFS client: an `hdfs://` path raises HDFSNotAvailable (an
OSError naming the path; the local files are already written by then). Any other path is a local one, which also
serves a shared file system mounted on every node.
"""

from __future__ import annotations

import os
import shutil

HDFS_PREFIX = "hdfs://"


class HDFSNotAvailable(OSError):
    """An hdfs:// path was given: Quiver reads and writes local (or mounted shared) paths only."""


def is_non_local(path: str | os.PathLike) -> bool:
    """Whether `path` is an HDFS path (verl's only non-local kind)."""
    return os.fspath(path).startswith(HDFS_PREFIX)


def check_local(path: str | os.PathLike) -> str:
    """`path` as a string; HDFSNotAvailable when it is an hdfs:// path."""
    path = os.fspath(path)
    if is_non_local(path):
        raise HDFSNotAvailable(
            f"{path}: HDFS is not built in Quiver (no HDFS client). Keep data and checkpoints on a local or shared "
            "file system mounted on every node, and give that path instead (a data script: leave out --hdfs_dir, "
            "or give it a mounted directory)")
    return path


def exists(path: str | os.PathLike, **kwargs) -> bool:
    """os.path.exists for a local path."""
    return os.path.exists(check_local(path))


def makedirs(name: str | os.PathLike, mode: int = 0o777, exist_ok: bool = False, **kwargs) -> None:
    """os.makedirs for a local path."""
    os.makedirs(check_local(name), mode=mode, exist_ok=exist_ok)


def copy(src: str | os.PathLike, dst: str | os.PathLike, **kwargs) -> str:
    """Copy a file (shutil.copy: `dst` may be a folder) or a folder tree (shutil.copytree) and return the
    destination. A folder is copied into `dst` even when it exists, since the scripts call `makedirs(dst)` first;
    `kwargs` go to the shutil function."""
    src, dst = check_local(src), check_local(dst)
    if os.path.isdir(src):
        return shutil.copytree(src, dst, **{"dirs_exist_ok": True, **kwargs})
    return shutil.copy(src, dst, **kwargs)
