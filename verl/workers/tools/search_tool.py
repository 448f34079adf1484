"""The search tool: `<search>query</search>` returns the top passages as lines `Page k: snippet`, or, with a
summariser, a summary of the top pages written for the query.

One tool with pluggable backends (param `backend`, search_backends.py):

- `bm25` (default): a local BM25 index over a JSONL corpus (`corpus_path`); offline.
- `http`: the reference's SERP API (Bright Data in front of Bing; `endpoint`, `api_key`, `zone`, `location`).

**Page summaries** (param `summary`, an OpenAI-compatible endpoint: `base_url`, `model`, `api_key_env`, `timeout_s`,
`max_retries`, `concurrency`; see verl/utils/openai_endpoint.py). ARPO's evaluation searches this way (its "Simple
Deep Search" tool with a served summarisation model): the tool fetches the pages of the top `summary_pages` hits
(HTTP GET, `page_timeout_s` per page, at most `page_max_bytes` read, the visible text cut to `page_chars`; a page
that cannot be fetched, or a hit without an address, gives its snippet instead) and asks the summariser, at
temperature 0 with at most `summary_max_tokens` tokens, for what the pages say about the query (`SUMMARY_PROMPT`).
The summary is the tool's result.

**Cache.** A persistent JSON cache (`cache_file`, `verl/utils/json_cache.py`; the reference's format, one object
`{query: result text}` written with `ensure_ascii=False, indent=2`) sits in front of either backend. Summaries go to
the same file under the key `["summary", <summariser model>, <query>]`, so a summary asked before makes no request
at all: no search, no page fetch, no summariser call.

Params: backend, corpus_path, api_key, zone, endpoint, location, request_timeout_s, max_results (5; the reference's
BingSearchTool 10), result_length (1000 characters per snippet), cache_file, cache_refresh_interval (15 s),
async_cache_write (accepted for the reference's YAML files; saving is synchronous, see JsonCache.put), summary
(null: snippets only), summary_pages (3), summary_max_tokens (1024), page_timeout_s (10), page_max_bytes (2 MB),
page_chars (8000), latency_s (0: each answer waits this long first, as a remote SERP API's 0.5-3 s would; for
benchmarks of the rollout's waits on the local backend).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from verl.utils.json_cache import JsonCache, key_of
from verl.utils.openai_endpoint import Endpoint, EndpointConfig, EndpointError, map_concurrently
from verl.workers.tools.base import BaseTool, ToolError
from verl.workers.tools.search_backends import DEFAULT_ENDPOINT, BM25Backend, HTTPBackend, SearchHit, fetch_page_text

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


SUMMARY_PROMPT = """You help a researcher who searched the web for: {query}

Below are the pages the search returned. Write a short summary of what they say that bears on the search: keep the
facts, names, numbers and dates that matter, and say which page each comes from (Page 1, Page 2, ...). If the pages
do not answer it, say so plainly. Use only what the pages say.

{pages}"""


def summary_prompt(query: str, pages: list[tuple[str, str]]) -> str:
    """SUMMARY_PROMPT for `query` and its (source, text) pages, numbered from 1."""
    listed = "\n\n".join(f"Page {k} ({source}):\n{text}" for k, (source, text) in enumerate(pages, start=1))
    return SUMMARY_PROMPT.format(query=query, pages=listed)


class SearchTool(BaseTool):
    """`<search>query</search>` -> `Page k: snippet` lines from the chosen backend, or a summary of the top pages,
    through the cache (module docstring for the params)."""

    name = "search"
    trigger_tag = "search"

    def __init__(self, backend: str = "bm25", corpus_path: str | None = None, api_key: str | None = None,
                 zone: str | None = None, endpoint: str = DEFAULT_ENDPOINT, location: str = "us",
                 request_timeout_s: float = 60.0, max_results: int = 5, result_length: int = 1000,
                 cache_file: str | None = None, cache_refresh_interval: float = 15.0, async_cache_write: Any = None,
                 summary: dict | None = None, summary_pages: int = 3, summary_max_tokens: int = 1024,
                 page_timeout_s: float = 10.0, page_max_bytes: int = 2_000_000, page_chars: int = 8000,
                 latency_s: float = 0.0):
        if max_results < 1 or result_length < 1:
            raise ValueError(f"search tool: max_results={max_results} and result_length={result_length} must be >= 1")
        if min(summary_pages, summary_max_tokens, page_max_bytes, page_chars) < 1 or page_timeout_s <= 0:
            raise ValueError(f"search tool: summary_pages={summary_pages}, summary_max_tokens={summary_max_tokens}, "
                             f"page_max_bytes={page_max_bytes} and page_chars={page_chars} must be >= 1 and "
                             f"page_timeout_s={page_timeout_s} > 0")
        if latency_s < 0:
            raise ValueError(f"search tool: latency_s={latency_s} must be >= 0")
        self.latency_s = float(latency_s)
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
        self.cache = JsonCache(cache_file, cache_refresh_interval, what="search cache") if cache_file else None
        try:
            endpoint = EndpointConfig.from_dict(summary, "search tool param summary") if summary else None
            self.summarizer = Endpoint(endpoint) if endpoint else None
        except (TypeError, ValueError) as err:
            raise ValueError(f"search tool: {err}") from err
        self.summary_pages, self.summary_max_tokens = summary_pages, summary_max_tokens
        self.page_timeout_s, self.page_max_bytes, self.page_chars = page_timeout_s, page_max_bytes, page_chars

    def execute(self, content: str) -> str:
        query = normalize_query(content)
        if not query:
            raise ToolError("the search query is empty")
        if self.latency_s:
            time.sleep(self.latency_s)
        if self.summarizer is not None:
            return self._summary(query)
        if self.cache is not None and (hit := self.cache.get(query)) is not None:
            return hit
        return self._snippets(query, self._search(query))

    def _search(self, query: str) -> list[SearchHit]:
        if self.backend is None:
            raise ToolError(f"{query!r} is not in the search cache, and {self._no_backend}")
        return self.backend.search(query, self.max_results)

    def _snippets(self, query: str, hits: list[SearchHit]) -> str:
        """The `Page k: snippet` text of the hits, saved in the cache when there are any."""
        text = format_results([hit.text for hit in hits], self.max_results, self.result_length)
        # Only answers with results are saved: an empty page from the API may be a hiccup worth asking again.
        if self.cache is not None and text != NO_RESULTS:
            self.cache.put(query, text)
        return text

    def _summary(self, query: str) -> str:
        """The summariser's account of the top pages for `query`, from the cache when it was asked before."""
        key = key_of("summary", self.summarizer.model, query)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            return hit
        cached = self.cache.get(query) if self.cache is not None else None
        if self.backend is None and cached is not None:
            pages = [("search results", cached)]  # offline: the cached snippets are all there is to summarise
        else:
            hits = [hit for hit in self._search(query) if hit.text.strip() or hit.url]
            if not hits:
                return NO_RESULTS
            self._snippets(query, hits)
            pages = map_concurrently(self._page, hits[: self.summary_pages], self.summary_pages)
        try:
            summary = self.summarizer.chat([{"role": "user", "content": summary_prompt(query, pages)}],
                                           temperature=0.0, max_tokens=self.summary_max_tokens).strip()
        except EndpointError as err:  # the endpoint has retried already
            raise ToolError(f"the page summariser failed: {err}") from err
        if not summary:
            raise ToolError(f"the page summariser ({self.summarizer.url}) returned an empty summary", retryable=True)
        if self.cache is not None:
            self.cache.put(key, summary)
        return summary

    def _page(self, hit: SearchHit) -> tuple[str, str]:
        """(source, text) of one hit: its page's text, or its snippet when the page cannot be fetched."""
        if hit.url:
            try:
                text = fetch_page_text(hit.url, self.page_timeout_s, self.page_max_bytes)
                if text:
                    return hit.url, text[: self.page_chars]
            except ToolError as err:
                logger.info("search tool: using the snippet instead of the page (%s)", err)
        return hit.url or "search result", hit.text[: self.page_chars]


class BingSearchTool(SearchTool):
    """The reference's class (`verl.workers.rollout.tools.search_tool.BingSearchTool` maps here) with its defaults:
    the http backend, 10 results, location cn."""

    def __init__(self, backend: str = "http", max_results: int = 10, location: str = "cn", **params: Any):
        super().__init__(backend=backend, max_results=max_results, location=location, **params)
