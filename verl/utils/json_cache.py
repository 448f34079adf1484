"""A persistent key -> JSON value cache in one JSON file, shared by the threads and processes that use it.

Three things in Quiver pay for a request and give the same answer to the same question: the search tool's queries,
its page summaries, and the LLM judge's verdicts. Each puts a `JsonCache` in front of the request, so that a rerun
(or another rollout worker) makes no request for what was already asked.

The file is one JSON object `{key: value}` written with `ensure_ascii=False, indent=2`: for search results this is
the format of ARPO's shipped `search_cache.json` (`{query: result text}`), which therefore serves as a cache file
as it is. Composite keys (a summary's model and query, a verdict's model, question and answers) are the JSON text of
a list (`key_of`), so they never collide with a plain query.

- The file is read at start and read again when it changed (inode, mtime or size), checked at most every
  `refresh_interval_s` seconds, so entries other processes saved become hits.
- `put` saves at once (`save_interval_s=0`, what the search tool uses: a worker may be killed at any time), or at
  most every `save_interval_s` seconds, for callers that add thousands of entries and call `save()` at the end.
- `save` works under an exclusive lock on `<file>.lock` (the filelock library, so it holds across processes): it
  reads the file, merges its entries with ours (ours win), writes a temporary file in the same directory and renames
  it over the file. Readers without the lock therefore always see a whole, valid JSON file, and a writer never drops
  an entry another one saved.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from typing import Any

from filelock import FileLock
from filelock import Timeout as LockTimeout

logger = logging.getLogger(__name__)


def key_of(*parts: Any) -> str:
    """One string key for several parts (JSON values): the JSON text of the list of them."""
    return json.dumps(list(parts), ensure_ascii=False)


class JsonCache:
    """key -> JSON value, in memory and in the JSON file `path` (module docstring). Thread-safe."""

    def __init__(self, path: str, refresh_interval_s: float = 15.0, lock_timeout_s: float = 60.0,
                 save_interval_s: float = 0.0, what: str = "cache"):
        self.path = os.path.abspath(os.path.expanduser(path))
        self.refresh_interval_s, self.save_interval_s = refresh_interval_s, save_interval_s
        self.what = what  # names the cache in log lines ("search cache", "judge cache")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file_lock = FileLock(self.path + ".lock", timeout=lock_timeout_s)
        self._mutex = threading.Lock()  # guards the fields below; never held while waiting for the file lock
        self._save_mutex = threading.Lock()  # one save at a time in this process
        self._entries: dict[str, Any] = {}
        self._dirty = False  # entries not yet saved
        self._signature: tuple | None = None  # (inode, mtime_ns, size) of the file we last read or wrote
        self._checked = float("-inf")
        self._saved = float("-inf")
        with self._mutex:
            self._refresh()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Any | None:
        with self._mutex:
            if time.monotonic() - self._checked >= self.refresh_interval_s:
                self._refresh()
            return self._entries.get(key)

    def put(self, key: str, value: Any) -> None:
        """Add an entry; save the file when `save_interval_s` has passed since the last save. A save that fails (lock
        timeout, disk full) is logged and retried with the next put: the caller's result does not depend on the
        cache."""
        with self._mutex:
            self._entries[key] = value
            self._dirty = True
            due = time.monotonic() - self._saved >= self.save_interval_s
        if due:
            try:
                self.save()
            except (OSError, LockTimeout) as err:
                logger.warning("%s %s: could not save (%s); will try again with the next entry", self.what, self.path,
                               err)

    def save(self) -> None:
        """Merge our entries into the file (module docstring); nothing to do when all are saved."""
        with self._save_mutex:
            with self._mutex:
                if not self._dirty:  # a concurrent put has saved our entry already
                    return
                snapshot, self._dirty = dict(self._entries), False
            try:
                with self._file_lock:
                    merged = {**self._read(), **snapshot}
                    signature = self._replace(merged)
            except BaseException:
                with self._mutex:
                    self._dirty = True
                raise
            with self._mutex:
                self._entries = {**merged, **self._entries}  # entries put meanwhile stay (and stay dirty)
                self._signature = signature
                self._saved = time.monotonic()

    def _refresh(self) -> None:
        """Merge the file into memory if it changed since we last saw it (caller holds _mutex)."""
        self._checked = time.monotonic()
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return
        signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if signature != self._signature:
            self._signature = signature
            self._entries = {**self._read(), **self._entries}

    def _read(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            logger.warning("%s %s is unreadable (%s); it will be rewritten from memory", self.what, self.path, err)
            return {}
        if not isinstance(data, dict):
            logger.warning("%s %s does not hold a JSON object; it will be rewritten from memory", self.what, self.path)
            return {}
        return data

    def _replace(self, entries: dict[str, Any]) -> tuple:
        """Write `entries` to a temporary file and rename it over the cache file; returns the new file's signature."""
        directory, name = os.path.split(self.path)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entries, f, ensure_ascii=False, indent=2)
                f.flush()
                os.fsync(f.fileno())
                try:  # keep the old file's permissions (mkstemp creates 0600, unreadable for other users)
                    os.chmod(tmp, os.stat(self.path).st_mode & 0o777)
                except FileNotFoundError:
                    os.chmod(tmp, 0o644)
                stat = os.fstat(f.fileno())  # a rename keeps inode and mtime
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return stat.st_ino, stat.st_mtime_ns, stat.st_size
