"""Where the search tool's passages come from: `search(query, k) -> hits (snippet, url), best first`, and
`fetch_page_text(url)`, the page behind a hit as plain text (for the tool's page summaries).

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
from html.parser import HTMLParser
from typing import NamedTuple

from verl.workers.tools.base import ToolError

DEFAULT_ENDPOINT = "https://api.brightdata.com/request"
API_KEY_ENV = ("SEARCH_API_KEY", "BRIGHTDATA_API_KEY")  # first one set wins
ZONE_ENV = ("SEARCH_ZONE", "BRIGHTDATA_ZONE")
# The reference asked `langid` whether a query is Chinese; a CJK character says the same for its data without a model.
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


class SearchHit(NamedTuple):
    """One search result: its snippet, and the address of its page when the backend knows one."""

    text: str
    url: str | None = None


class BM25Backend:
    """Top passages of a JSONL corpus by BM25 (Lucene variant, k1=1.5, b=0.75; English stop words, no stemming).

    Each row has `text` and optionally `title`, `url` (the page a summary fetches) and `id` (unused); a passage reads
    `title: text`."""

    def __init__(self, corpus_path: str | None):
        import bm25s

        if not corpus_path or not os.path.isfile(corpus_path):
            raise ValueError(f"search tool: corpus_path={corpus_path!r} is not a file (the bm25 backend needs a JSONL "
                             "corpus, one {\"text\": ..., \"title\": ...} object per line)")
        self.passages, self.urls = [], []
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
                self.urls.append(row.get("url") or None)
        if not self.passages:
            raise ValueError(f"search tool: {corpus_path} holds no passages")
        self._tokenize = bm25s.tokenize
        self.index = bm25s.BM25()
        self.index.index(self._tokens(self.passages), show_progress=False)

    def _tokens(self, texts: list[str]) -> list[list[str]]:
        return self._tokenize(texts, stopwords="en", return_ids=False, show_progress=False)

    def search(self, query: str, k: int) -> list[SearchHit]:
        docs, scores = self.index.retrieve(self._tokens([query]), k=min(k, len(self.passages)), show_progress=False)
        # A score of 0 means no query word occurs in the passage.
        return [SearchHit(self.passages[doc], self.urls[doc])
                for doc, score in zip(docs[0].tolist(), scores[0].tolist()) if score > 0]


class HTTPBackend:
    """A SERP API: POST `{zone, url: <Bing search URL>, format: "raw"}` with `Authorization: Bearer <api_key>` to
    `endpoint`; the hits are `organic[*].description` (snippet) and `.link` (page) of the JSON answer.

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

    def search(self, query: str, k: int) -> list[SearchHit]:
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
        return [SearchHit(item.get("description") or "", item.get("link") or None)
                for item in organic or [] if isinstance(item, dict)]


class _PageText(HTMLParser):
    """The visible text of an HTML page and its title: script, style and other non-text elements dropped, one line
    per block."""

    _HIDDEN = {"script", "style", "noscript", "template", "svg"}
    _BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "table",
               "title", "pre", "blockquote", "dd", "dt"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in self._HIDDEN:
            self._hidden_depth += 1
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self._HIDDEN:
            self._hidden_depth = max(0, self._hidden_depth - 1)
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._hidden_depth:
            self.parts.append(data)

    def text(self) -> str:
        lines = (" ".join(line.split()) for line in "".join(self.parts).splitlines())
        return "\n".join(line for line in lines if line)


def html_to_text(html: str) -> str:
    """The visible text of an HTML document, one line per block element, runs of spaces collapsed."""
    parser = _PageText()
    parser.feed(html)
    parser.close()
    return parser.text()


def fetch_page_text(url: str, timeout_s: float, max_bytes: int) -> str:
    """GET `url` (http or https) and return its text: HTML reduced to its visible text, plain text as it is. At most
    `max_bytes` of the body are read (a bigger page is cut there); `timeout_s` bounds the connection and each read.
    Raises ToolError for another scheme, a failed request or a content type that is not text."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ToolError(f"page {url!r}: only http and https addresses are fetched")
    request = urllib.request.Request(url, headers={"User-Agent": "Mozilla/5.0 (compatible; Quiver search tool)"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            content_type = response.headers.get_content_type()
            if not content_type.startswith("text/") and content_type != "application/xhtml+xml":
                raise ToolError(f"page {url}: content type {content_type} is not text")
            body = response.read(max_bytes)
            charset = response.headers.get_content_charset() or "utf-8"
    except urllib.error.HTTPError as err:
        raise ToolError(f"page {url}: HTTP {err.code}") from err
    except (OSError, ValueError) as err:  # URLError, timeouts, resets; a malformed address
        raise ToolError(f"page {url}: {type(err).__name__}: {err}") from err
    try:
        text = body.decode(charset, errors="replace")
    except LookupError:  # an unknown charset name
        text = body.decode("utf-8", errors="replace")
    return html_to_text(text) if "html" in content_type else text.strip()
