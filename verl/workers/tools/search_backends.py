"""Where the search tool's passages come from: `search(query, k) -> snippets, best first`.

- `BM25Backend`: a local BM25 index (the `bm25s` library) over a JSONL corpus; offline.
- `HTTPBackend`: a SERP API in front of Bing, as the reference used (Bright Data's request endpoint).

A backend raises `ToolError(retryable=True)` for a failure another attempt may fix (network, HTTP status); the tool
manager retries those.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request

from verl.workers.tools.base import ToolError

DEFAULT_ENDPOINT = "https://api.brightdata.com/request"
API_KEY_ENV = ("SEARCH_API_KEY", "BRIGHTDATA_API_KEY")  # first one set wins
ZONE_ENV = ("SEARCH_ZONE", "BRIGHTDATA_ZONE")
# The reference asked `langid` whether a query is Chinese; a CJK character says the same for its data without a model.
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


class BM25Backend:
    """Top passages of a JSONL corpus by BM25 (Lucene variant, k1=1.5, b=0.75; English stop words, no stemming).

    Each row has `text` and optionally `title` (and `id`, unused); a passage reads `title: text`."""

    def __init__(self, corpus_path: str | None):
        import bm25s

        if not corpus_path or not os.path.isfile(corpus_path):
            raise ValueError(f"search tool: corpus_path={corpus_path!r} is not a file (the bm25 backend needs a JSONL "
                             "corpus, one {\"text\": ..., \"title\": ...} object per line)")
        self.passages = []
        with open(corpus_path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"search tool: {corpus_path} line {number} is not JSON ({err})") from err
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise ValueError(f"search tool: {corpus_path} line {number} has no string field 'text'")
                title = row.get("title")
                self.passages.append(f"{title}: {row['text']}" if title else row["text"])
        if not self.passages:
            raise ValueError(f"search tool: {corpus_path} holds no passages")
        self._tokenize = bm25s.tokenize
        self.index = bm25s.BM25()
        self.index.index(self._tokens(self.passages), show_progress=False)

    def _tokens(self, texts: list[str]) -> list[list[str]]:
        return self._tokenize(texts, stopwords="en", return_ids=False, show_progress=False)

    def search(self, query: str, k: int) -> list[str]:
        docs, scores = self.index.retrieve(self._tokens([query]), k=min(k, len(self.passages)), show_progress=False)
        # A score of 0 means no query word occurs in the passage.
        return [self.passages[doc] for doc, score in zip(docs[0].tolist(), scores[0].tolist()) if score > 0]


class HTTPBackend:
    """A SERP API: POST `{zone, url: <Bing search URL>, format: "raw"}` with `Authorization: Bearer <api_key>` to
    `endpoint`; the snippets are `organic[*].description` of the JSON answer.

    api_key / zone: params, else the environment (SEARCH_API_KEY or BRIGHTDATA_API_KEY, SEARCH_ZONE or
    BRIGHTDATA_ZONE). location: Bing's `cc` country code."""

    def __init__(self, api_key: str | None = None, zone: str | None = None, endpoint: str = DEFAULT_ENDPOINT,
                 location: str = "us", timeout_s: float = 60.0):
        self.api_key = api_key or next((os.environ[name] for name in API_KEY_ENV if os.environ.get(name)), None)
        self.zone = zone or next((os.environ[name] for name in ZONE_ENV if os.environ.get(name)), None)
        if not self.api_key or not self.zone:
            missing = [what for what, value in (("api_key", self.api_key), ("zone", self.zone)) if not value]
            raise ValueError(f"search tool (backend=http): {' and '.join(missing)} not set; give the params api_key "
                             f"and zone, or the environment variables {API_KEY_ENV[0]} and {ZONE_ENV[0]} (or "
                             f"{API_KEY_ENV[1]} and {ZONE_ENV[1]})")
        self.endpoint, self.location, self.timeout_s = endpoint, location, timeout_s

    def search_url(self, query: str) -> str:
        market, language = ("zh-CN", "zh") if _CJK.search(query) else ("en-US", "en")
        params = {"q": query, "mkt": market, "setLang": language, "brd_json": 1, "cc": self.location}
        return "https://www.bing.com/search?" + urllib.parse.urlencode(params)

    def search(self, query: str, k: int) -> list[str]:
        body = json.dumps({"zone": self.zone, "url": self.search_url(query), "format": "raw"}).encode("utf-8")
        request = urllib.request.Request(self.endpoint, data=body, method="POST", headers={
            "Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            detail = err.read(300).decode("utf-8", "replace").strip()
            raise ToolError(f"search API answered HTTP {err.code}: {detail or err.reason}", retryable=True) from err
        except (OSError, ValueError) as err:  # URLError, timeouts and resets are OSErrors; bad JSON is a ValueError
            raise ToolError(f"search API request failed: {type(err).__name__}: {err}", retryable=True) from err
        organic = payload.get("organic") if isinstance(payload, dict) else None
        return [item.get("description") or "" for item in organic or [] if isinstance(item, dict)]
