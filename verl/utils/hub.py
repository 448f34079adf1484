"""Model paths that name a Hugging Face Hub repository (`Qwen/Qwen2.5-7B-Instruct`), as verl's scripts write them.

A path that is a local directory is used as it is. One of the form `owner/name` that is not a directory is fetched
with `huggingface_hub.snapshot_download` into the Hugging Face cache (`HF_HOME` / `HF_HUB_CACHE`), or found there
when it is already cached (with `HF_HUB_OFFLINE=1` only the cache is read), and the cached snapshot's directory is
used from then on, by the driver and every worker alike.
"""

from __future__ import annotations

import os
import re

from verl.utils.config import ConfigError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def local_model_path(path: str | None, key: str) -> str | None:
    """`path` itself when it is a local directory (or None, or not of the form owner/name), else the local snapshot
    of that Hub repository; a ConfigError naming `key` when it cannot be had."""
    if path is None or os.path.isdir(os.path.expanduser(path)) or not HUB_ID.match(path):
        return path
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id=path)
    except Exception as err:  # offline without a cached copy, a private repo, no network: one message
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
        hint = ("HF_HUB_OFFLINE is set and the Hugging Face cache has no copy of it" if offline
                else f"fetching it from the Hugging Face Hub failed ({type(err).__name__}: {err})")
        raise ConfigError(f"{key}={path} is not a local directory, and {hint}; download it first "
                          f"(huggingface-cli download {path}) or give a local path") from err
