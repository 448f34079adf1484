"""The search tool: `<search>query</search>` returns the top passages as lines `Page k: snippet`.

One tool with pluggable backends (param `backend`, search_backends.py):

- `bm25` (default): a local BM25 index over a JSONL corpus (`corpus_path`); offline.
- `http`: the reference's SERP API (Bright Data in front of Bing; `endpoint`, `api_key`, `zone`, `location`).

A persistent JSON query cache (`cache_file`, the reference's format: one object `{query: result text}`, written with
`ensure_ascii=False, indent=2`) sits in front of either; see `QueryCache`.

Params: backend, corpus_path, api_key, zone, endpoint, location, request_timeout_s, max_results (5; the reference's
BingSearchTool 10), result_length (1000 characters per snippet), cache_file, cache_refresh_interval (15 s),
async_cache_write (accepted for the reference's YAML files; saving is synchronous, see QueryCache.put).
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

from verl.workers.tools.base import BaseTool, ToolError
from verl.workers.tools.search_backends import DEFAULT_ENDPOINT, BM25Backend, HTTPBackend

logger = logging.getLogger(__name__)

NO_RESULTS = "No search results found."


def normalize_query(query: str) -> str:
    """The query as sent and as the cache key: `"` removed (as the reference did), runs of whitespace collapsed to one
    space and the ends stripped. The reference keyed its cache on the query with only `"` removed, so "a  b" and
    "a b" were two entries and two API calls."""
    return " ".join(query.replace('"', "").split())


def format_results(snippets: list[str], max_results: int, result_length: int) -> str:
    """Lines `Page k: snippet` of the first `max_results` distinct non-empty snippets, each cut to `result_length`
    characters; `No search results found.` when there is none."""
    kept: list[str] = []
    for snippet in snippets:
        snippet = str(snippet or "").strip()
        if snippet and snippet not in kept:
            kept.append(snippet)
    lines = [f"Page {k}: {snippet[:result_length]}" for k, snippet in enumerate(kept[:max_results], start=1)]
    return "\n".join(lines) or NO_RESULTS


class QueryCache:
    """query -> result text, in memory and in a JSON file that threads and processes (one per rollout worker) share.

    - The file is read at start and read again when it changed (inode, mtime or size), checked at most every
      `refresh_interval_s` seconds, so entries other processes saved become hits.
    - `put` saves at once: under an exclusive lock on `<file>.lock` (the filelock library, so it holds across
      processes) it reads the file, merges its entries with ours (ours win, as in the reference), writes a temporary
      file in the same directory and renames it over the file. Readers without the lock therefore always see a
      whole, valid JSON file, and a writer never drops an entry another one saved.
    """

    def __init__(self, path: str, refresh_interval_s: float = 15.0, lock_timeout_s: float = 60.0):
        self.path, self.refresh_interval_s = os.path.abspath(path), refresh_interval_s
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file_lock = FileLock(self.path + ".lock", timeout=lock_timeout_s)
        self._mutex = threading.Lock()  # guards the fields below; never held while waiting for the file lock
        self._save_mutex = threading.Lock()  # one save at a time in this process
        self._entries: dict[str, str] = {}
        self._dirty = False  # entries not yet saved
        self._signature: tuple | None = None  # (inode, mtime_ns, size) of the file we last read or wrote
        self._checked = float("-inf")
        with self._mutex:
            self._refresh()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, query: str) -> str | None:
        with self._mutex:
            if time.monotonic() - self._checked >= self.refresh_interval_s:
                self._refresh()
            return self._entries.get(query)

    def put(self, query: str, text: str) -> None:
        """Add an entry and save the file. A save that fails (lock timeout, disk full) is logged and retried with the
        next put: the caller's result does not depend on the cache."""
        with self._mutex:
            self._entries[query] = text
            self._dirty = True
        try:
            self.save()
        except (OSError, LockTimeout) as err:
            logger.warning("search cache %s: could not save (%s); will try again with the next entry", self.path, err)

    def save(self) -> None:
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

    def _read(self) -> dict[str, str]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            logger.warning("search cache %s is unreadable (%s); it will be rewritten from memory", self.path, err)
            return {}
        if not isinstance(data, dict):
            logger.warning("search cache %s does not hold a JSON object; it will be rewritten from memory", self.path)
            return {}
        return data

    def _replace(self, entries: dict[str, str]) -> tuple:
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


class SearchTool(BaseTool):
    """`<search>query</search>` -> `Page k: snippet` lines from the chosen backend, through the cache (module
    docstring for the params)."""

    name = "search"
    trigger_tag = "search"

    def __init__(self, backend: str = "bm25", corpus_path: str | None = None, api_key: str | None = None,
                 zone: str | None = None, endpoint: str = DEFAULT_ENDPOINT, location: str = "us",
                 request_timeout_s: float = 60.0, max_results: int = 5, result_length: int = 1000,
                 cache_file: str | None = None, cache_refresh_interval: float = 15.0, async_cache_write: Any = None):
        if max_results < 1 or result_length < 1:
            raise ValueError(f"search tool: max_results={max_results} and result_length={result_length} must be >= 1")
        if backend == "bm25":
            self.backend = BM25Backend(corpus_path)
        elif backend == "http":
            try:
                self.backend = HTTPBackend(api_key, zone, endpoint, location, request_timeout_s)
            except ValueError as err:
                if not cache_file:
                    raise
                # The seeds ship a query cache that serves as an offline search: answer from it alone.
                self.backend, self._no_backend = None, str(err)
                logger.warning("%s; answering from the cache file %s only", err, cache_file)
        else:
            raise ValueError(f"search tool: backend={backend!r} must be 'bm25' or 'http'")
        self.max_results, self.result_length = max_results, result_length
        self.cache = QueryCache(cache_file, cache_refresh_interval) if cache_file else None

    def execute(self, content: str) -> str:
        query = normalize_query(content)
        if not query:
            raise ToolError("the search query is empty")
        if self.cache is not None and (hit := self.cache.get(query)) is not None:
            return hit
        if self.backend is None:
            raise ToolError(f"{query!r} is not in the search cache, and {self._no_backend}")
        snippets = self.backend.search(query, self.max_results)
        text = format_results(snippets, self.max_results, self.result_length)
        # Only answers with results are saved: an empty page from the API may be a hiccup worth asking again.
        if self.cache is not None and text != NO_RESULTS:
            self.cache.put(query, text)
        return text


class BingSearchTool(SearchTool):
    """The reference's class (`verl.workers.rollout.tools.search_tool.BingSearchTool` maps here) with its defaults:
    the http backend, 10 results, location cn."""

    def __init__(self, backend: str = "http", max_results: int = 10, location: str = "cn", **params: Any):
        super().__init__(backend=backend, max_results=max_results, location=location, **params)
