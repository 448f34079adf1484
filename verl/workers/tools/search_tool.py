"""The search tool: `<search>query</search>` returns the top passages as lines `Page k: snippet`.

One tool, pluggable backends (param `backend`):

- `bm25` (default): a local BM25 index (the `bm25s` library) over a JSONL corpus (`corpus_path`, rows with `text`
  and optional `title`), built once at start-up. Offline; what the tiny recipes and the tests use.
- `http`: a SERP API like the seed's (Bright Data's request endpoint in front of Bing): a POST of
  `{zone, url: <bing search url>, format: "raw"}` with a Bearer key to `endpoint`; the snippets are the
  `organic[*].description` fields. `api_key` / `zone` come from params or from SEARCH_API_KEY / SEARCH_ZONE.

A persistent JSON query cache (`cache_file`, the seed's format: one object query -> result text) sits in front of
either: hits skip the backend; new successful results are merged into the file under an exclusive file lock and the
file is replaced atomically, so several processes (one per rollout rank) can share it without losing entries. Keys
are the query with `"` removed and whitespace collapsed (the seed keyed on the raw string, so "a  b" and "a b" missed
each other). Writes are synchronous; `async_cache_write` is accepted for the seed's YAML and ignored.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from filelock import FileLock

from verl.workers.tools.base import BaseTool, ToolError

NO_RESULTS = "No search results found."
DEFAULT_ENDPOINT = "https://api.brightdata.com/request"
_CJK = re.compile(r"[\u4e00-\u9fff]")


def normalize_query(query: str) -> str:
    return " ".join(query.replace('"', " ").split())


def format_results(snippets: list[str], max_results: int, result_length: int) -> str:
    """`Page k: snippet` lines of the first `max_results` distinct non-empty snippets, each cut to `result_length`."""
    kept: list[str] = []
    for snippet in snippets:
        snippet = (snippet or "").strip()
        if snippet and snippet not in kept:
            kept.append(snippet)
    lines = [f"Page {k}: {s[:result_length]}" for k, s in enumerate(kept[:max_results], start=1)]
    return "\n".join(lines) or NO_RESULTS


class BM25Backend:
    """Top passages of a JSONL corpus by BM25 (bm25s, English stop words)."""

    def __init__(self, corpus_path: str):
        import bm25s

        if not corpus_path or not os.path.isfile(corpus_path):
            raise ValueError(f"search tool: corpus_path={corpus_path!r} is not a file (the bm25 backend needs a JSONL "
                             "corpus with a 'text' field per row)")
        self.passages = []
        with open(corpus_path) as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    row = json.loads(line)
                    if "text" not in row:
                        raise ValueError(f"search tool: {corpus_path} line {number} has no 'text' field")
                    title = row.get("title")
                    self.passages.append(f"{title}: {row['text']}" if title else row["text"])
        if not self.passages:
            raise ValueError(f"search tool: {corpus_path} holds no passages")
        self._bm25s = bm25s
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize(self.passages, stopwords="en", show_progress=False), show_progress=False)

    def search(self, query: str, k: int) -> list[str]:
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:
            return []
        docs, scores = self.index.retrieve(tokens, k=min(k, len(self.passages)), show_progress=False)
        return [self.passages[d] for d, s in zip(docs[0].tolist(), scores[0].tolist()) if s > 0]


class HTTPBackend:
    """A SERP API: POST {zone, url, format: raw} with a Bearer key; snippets from organic[*].description."""

    def __init__(self, api_key: str | None, zone: str | None, endpoint: str = DEFAULT_ENDPOINT,
                 location: str = "us", timeout_s: float = 60.0):
        self.api_key = api_key or os.environ.get("SEARCH_API_KEY") or os.environ.get("BRIGHTDATA_API_KEY")
        self.zone = zone or os.environ.get("SEARCH_ZONE") or os.environ.get("BRIGHTDATA_ZONE")
        if not self.api_key or not self.zone:
            raise ValueError("search tool (backend=http): set params api_key and zone, or the environment variables "
                             "SEARCH_API_KEY and SEARCH_ZONE")
        self.endpoint, self.location, self.timeout_s = endpoint, location, timeout_s

    def search_url(self, query: str) -> str:
        market, language = ("zh-CN", "zh") if _CJK.search(query) else ("en-US", "en")
        params = {"q": query, "mkt": market, "setLang": language, "brd_json": 1, "cc": self.location}
        return "https://www.bing.com/search?" + urllib.parse.urlencode(params)

    def search(self, query: str, k: int) -> list[str]:
        body = json.dumps({"zone": self.zone, "url": self.search_url(query), "format": "raw"}).encode()
        request = urllib.request.Request(self.endpoint, data=body, method="POST", headers={
            "Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read().decode("utf-8"))
        except (urllib.error.URLError, TimeoutError, OSError, json.JSONDecodeError) as err:
            raise ToolError(f"search request failed: {err}", retryable=True) from err
        organic = payload.get("organic") or [] if isinstance(payload, dict) else []
        return [item.get("description", "") for item in organic if isinstance(item, dict)]


class QueryCache:
    """query -> result text, in memory and in a JSON file shared between threads and processes (module docstring)."""

    def __init__(self, path: str, refresh_interval_s: float = 15.0):
        self.path, self.refresh_interval_s = path, refresh_interval_s
        self.lock = FileLock(path + ".lock", timeout=30)
        self._mutex = threading.Lock()
        self._entries: dict[str, str] = {}
        self._mtime, self._checked = None, 0.0
        self._reload(force=True)

    def _read_file(self) -> dict[str, str]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def _reload(self, force: bool = False) -> None:
        import time

        now = time.monotonic()
        if not force and now - self._checked < self.refresh_interval_s:
            return
        self._checked = now
        try:
            mtime = os.path.getmtime(self.path)
        except FileNotFoundError:
            return
        if force or mtime != self._mtime:
            self._mtime = mtime
            self._entries.update(self._read_file())

    def get(self, query: str) -> str | None:
        with self._mutex:
            self._reload()
            return self._entries.get(query)

    def put(self, query: str, text: str) -> None:
        with self._mutex:
            self._entries[query] = text
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            with self.lock:
                merged = {**self._read_file(), **self._entries}
                fd, tmp = tempfile.mkstemp(prefix=".search_cache.", dir=directory)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(merged, f, ensure_ascii=False, indent=2)
                os.replace(tmp, self.path)
                self._entries = merged
                self._mtime = os.path.getmtime(self.path)


class SearchTool(BaseTool):
    """Params: backend (bm25 | http), corpus_path (bm25), api_key / zone / endpoint / location / request_timeout_s
    (http), max_results, result_length, cache_file, cache_refresh_interval, async_cache_write (ignored)."""

    name = "search"
    trigger_tag = "search"

    def __init__(self, backend: str = "bm25", corpus_path: str | None = None, api_key: str | None = None,
                 zone: str | None = None, endpoint: str = DEFAULT_ENDPOINT, location: str = "us",
                 request_timeout_s: float = 60.0, max_results: int = 5, result_length: int = 1000,
                 cache_file: str | None = None, cache_refresh_interval: float = 15.0, async_cache_write: Any = None):
        if backend == "bm25":
            self.backend = BM25Backend(corpus_path)
        elif backend == "http":
            self.backend = HTTPBackend(api_key, zone, endpoint, location, request_timeout_s)
        else:
            raise ValueError(f"search tool: backend={backend!r} must be bm25 or http")
        if max_results < 1 or result_length < 1:
            raise ValueError(f"search tool: max_results={max_results} and result_length={result_length} must be >= 1")
        self.max_results, self.result_length = max_results, result_length
        self.cache = QueryCache(cache_file, cache_refresh_interval) if cache_file else None

    def execute(self, content: str) -> str:
        query = normalize_query(content)
        if not query:
            raise ToolError("empty search query")
        if self.cache is not None and (hit := self.cache.get(query)) is not None:
            return hit
        text = format_results(self.backend.search(query, self.max_results), self.max_results, self.result_length)
        if self.cache is not None:
            self.cache.put(query, text)
        return text


class BingSearchTool(SearchTool):
    """The seed's name and defaults (the http backend, 10 results, location cn)."""

    def __init__(self, backend: str = "http", max_results: int = 10, location: str = "cn", **params: Any):
        super().__init__(backend=backend, max_results=max_results, location=location, **params)
