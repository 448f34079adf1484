"""The search tool: BM25 over a local corpus, the HTTP backend against a local stub server, the shared query cache,
and page summaries (pages from a local web server, the summariser a scripted OpenAI-compatible server)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verl.utils.json_cache import JsonCache
from verl.workers.tools import ToolError, ToolManager
from verl.workers.tools.search_backends import API_KEY_ENV, ZONE_ENV
from verl.workers.tools.search_tool import NO_RESULTS, SearchTool, format_results, normalize_query

CORPUS = [
    {"id": "1", "title": "Veltria", "text": "The capital of Veltria is Ostmar, a city on the river Quell."},
    {"id": "2", "title": "Ostmar", "text": "Ostmar has a population of 120000 people."},
    {"id": "3", "title": "Cats", "text": "Cats sleep for most of the day."},
    {"id": "4", "text": "Rivers of Veltria: the Quell and the Narn."},
]


def write_corpus(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


@pytest.fixture()
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.jsonl", CORPUS)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No credentials from the machine; no proxy, so requests to the stub stay on 127.0.0.1."""
    for name in API_KEY_ENV + ZONE_ENV + ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy",
                                          "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------------------------------------- bm25
def test_bm25_ranks_the_matching_passages_first(corpus):
    tool = SearchTool(corpus_path=corpus)
    assert tool.execute("capital of Veltria").splitlines() == [
        "Page 1: Veltria: The capital of Veltria is Ostmar, a city on the river Quell.",
        "Page 2: Rivers of Veltria: the Quell and the Narn.",  # one query word; a row without a title
    ]
    assert tool.execute("population Ostmar").startswith("Page 1: Ostmar: Ostmar has a population of 120000")
    assert tool.execute("zebra quantum") == NO_RESULTS
    assert tool.execute("the of a") == NO_RESULTS  # stop words only


def test_bm25_results_are_cut_to_max_results_and_result_length(corpus):
    tool = SearchTool(corpus_path=corpus, max_results=1, result_length=20)
    assert tool.execute("Veltria Quell Ostmar") == "Page 1: Veltria: The capital"


def test_formatting_and_query_normalisation():
    assert format_results(["a", " a ", "", None, "b", "c"], max_results=2, result_length=10) == "Page 1: a\nPage 2: b"
    assert format_results(["abcdef"], 3, 4) == "Page 1: abcd"
    assert format_results([], 3, 10) == NO_RESULTS
    assert normalize_query('  "capital"   of\nX ') == "capital of X"
    assert normalize_query('the "x"y') == "the xy"  # `"` removed as in the reference


def test_a_latency_makes_each_answer_wait_before_the_same_result(corpus, monkeypatch):
    import verl.workers.tools.search_tool as search_tool

    waits = []
    monkeypatch.setattr(search_tool.time, "sleep", waits.append)
    slow, quick = SearchTool(corpus_path=corpus, latency_s=0.5), SearchTool(corpus_path=corpus)
    assert slow.execute("capital of Veltria") == quick.execute("capital of Veltria")
    assert waits == [0.5]
    with pytest.raises(ValueError, match="latency_s=-1"):
        SearchTool(corpus_path=corpus, latency_s=-1)


def test_bad_params_are_named(tmp_path, corpus):
    with pytest.raises(ValueError, match="corpus_path=None is not a file"):
        SearchTool()
    with pytest.raises(ValueError, match="backend='bing' must be 'bm25' or 'http'"):
        SearchTool(backend="bing", corpus_path=corpus)
    with pytest.raises(ValueError, match="max_results=0"):
        SearchTool(corpus_path=corpus, max_results=0)
    with pytest.raises(ValueError, match="line 2 has no string field 'text'"):
        SearchTool(corpus_path=write_corpus(tmp_path / "a.jsonl", [{"text": "x"}, {"body": "y"}]))
    bad_json = tmp_path / "b.jsonl"
    bad_json.write_text('{"text": "x"}\n{text\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        SearchTool(corpus_path=str(bad_json))
    with pytest.raises(ToolError, match="the search query is empty") as err:
        SearchTool(corpus_path=corpus).execute('  " ')
    assert not err.value.retryable


# ---------------------------------------------------------------------------------------------- http
class StubSERP(BaseHTTPRequestHandler):
    """Answers like the SERP API: organic results with descriptions (some empty or missing)."""

    requests: list = []
    status = 200
    body = DEFAULT_BODY = json.dumps({"organic": [{"description": " Ostmar is the capital. "}, {"description": ""},
                                   {"title": "no description"}, {"description": "Veltria lies on the Quell."}]})

    def do_POST(self):  # noqa: N802 -- http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StubSERP.requests.append((dict(self.headers), body))
        self.send_response(StubSERP.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(StubSERP.body.encode() if StubSERP.status == 200 else b'{"error": "zone is paused"}')

    def log_message(self, *args):
        pass


@pytest.fixture()
def serp():
    StubSERP.requests, StubSERP.status, StubSERP.body = [], 200, StubSERP.DEFAULT_BODY
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubSERP)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/request"
    server.shutdown()
    server.server_close()


def test_http_backend_sends_the_reference_request(serp, monkeypatch):
    monkeypatch.setenv("SEARCH_API_KEY", "k123")
    monkeypatch.setenv("SEARCH_ZONE", "serp_zone")
    tool = SearchTool(backend="http", endpoint=serp, location="cn", max_results=5, result_length=12)
    assert tool.execute('capital  of "Veltria"') == "Page 1: Ostmar is th\nPage 2: Veltria lies"
    headers, body = StubSERP.requests[0]
    assert headers["Authorization"] == "Bearer k123" and headers["Content-Type"] == "application/json"
    assert set(body) == {"zone", "url", "format"} and body["zone"] == "serp_zone" and body["format"] == "raw"
    assert body["url"] == ("https://www.bing.com/search?q=capital+of+Veltria&mkt=en-US&setLang=en&brd_json=1&cc=cn")
    assert "mkt=zh-CN&setLang=zh" in tool.backend.search_url("维尔特里亚的首都")


def test_http_backend_credentials(serp, monkeypatch):
    with pytest.raises(ValueError, match="api_key and zone not set.*SEARCH_API_KEY and SEARCH_ZONE"):
        SearchTool(backend="http", endpoint=serp)
    monkeypatch.setenv("BRIGHTDATA_API_KEY", "bd")
    with pytest.raises(ValueError, match="zone not set"):
        SearchTool(backend="http", endpoint=serp)
    tool = SearchTool(backend="http", endpoint=serp, zone="z")  # the key from BRIGHTDATA_API_KEY
    assert (tool.backend.api_key, tool.backend.zone) == ("bd", "z")
    tool = SearchTool(backend="http", endpoint=serp, api_key="param", zone="z")  # params win
    assert tool.backend.api_key == "param"


def test_http_failures_are_retryable_and_retried_by_the_manager(serp):
    tool = SearchTool(backend="http", api_key="k", zone="z", endpoint=serp)
    StubSERP.status = 503
    with pytest.raises(ToolError, match="HTTP 503: .*zone is paused") as err:
        tool.execute("query")
    assert err.value.retryable

    with ToolManager([tool], retry_count=3) as tools:
        (result,) = tools.run([("search", "query")])
    assert len(StubSERP.requests) == 1 + 3 and not result.success
    assert result.text.startswith("Error: Tool(search) execution failed with message: search API answered HTTP 503")

    StubSERP.status, StubSERP.body = 200, "<html>not json</html>"
    with pytest.raises(ToolError, match="request failed") as err:
        tool.execute("query")
    assert err.value.retryable

    closed = SearchTool(backend="http", api_key="k", zone="z", endpoint="http://127.0.0.1:9/request")
    with pytest.raises(ToolError, match="request failed") as err:  # nothing listens on port 9
        closed.execute("query")
    assert err.value.retryable


def test_bing_search_tool_has_the_reference_defaults(serp):
    from verl.workers.tools.search_tool import BingSearchTool

    tool = BingSearchTool(api_key="k", zone="z", endpoint=serp)
    assert (tool.max_results, tool.backend.location, tool.result_length) == (10, "cn", 1000)


# ---------------------------------------------------------------------------------------------- cache
def test_cache_hits_skip_the_backend(serp, tmp_path):
    cache = tmp_path / "cache" / "search_cache.json"
    tool = SearchTool(backend="http", api_key="k", zone="z", endpoint=serp, cache_file=str(cache))
    first = tool.execute('capital  of "Veltria"')
    assert tool.execute("capital of Veltria ") == first and len(StubSERP.requests) == 1
    # The reference's file format: one JSON object, indent 2, non-ASCII kept as it is.
    assert cache.read_text(encoding="utf-8") == json.dumps({"capital of Veltria": first}, ensure_ascii=False,
                                                           indent=2)
    # A new tool (another process) reads the file.
    again = SearchTool(backend="http", api_key="k", zone="z", endpoint=serp, cache_file=str(cache))
    assert again.execute("capital of Veltria") == first and len(StubSERP.requests) == 1


def test_only_results_are_cached(serp, tmp_path):
    cache = tmp_path / "search_cache.json"
    tool = SearchTool(backend="http", api_key="k", zone="z", endpoint=serp, cache_file=str(cache))
    StubSERP.body = json.dumps({"organic": []})
    assert tool.execute("nothing") == NO_RESULTS
    StubSERP.status = 500
    with pytest.raises(ToolError):
        tool.execute("broken")
    assert not cache.exists() and len(tool.cache) == 0


def test_cache_sees_entries_other_processes_saved(tmp_path, corpus):
    path = tmp_path / "search_cache.json"
    path.write_text(json.dumps({"capital of Veltria": "Page 1: from the file 中文"}, ensure_ascii=False))
    tool = SearchTool(corpus_path=corpus, cache_file=str(path), cache_refresh_interval=0.0)
    assert tool.execute("capital of Veltria") == "Page 1: from the file 中文"
    other = JsonCache(str(path))
    other.put("cats", "Page 1: from another writer")
    assert tool.execute("cats") == "Page 1: from another writer"
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert set(saved) == {"capital of Veltria", "cats"}
    assert "中文" in path.read_text(encoding="utf-8")  # ensure_ascii=False


def test_without_credentials_a_cache_file_serves_as_an_offline_search(serp, tmp_path, monkeypatch):
    for name in (*API_KEY_ENV, *ZONE_ENV):
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "search_cache.json"
    cache.write_text(json.dumps({"capital of Veltria": "Page 1: Ostmar"}))
    tool = SearchTool(backend="http", endpoint=serp, cache_file=str(cache))
    assert tool.execute("capital of Veltria") == "Page 1: Ostmar"
    with pytest.raises(ToolError, match="'largest lake' is not in the search cache, and .*api_key and zone not set"):
        tool.execute("largest lake")
    assert StubSERP.requests == []  # nothing was sent


# ---------------------------------------------------------------------------------------------- page summaries
OSTMAR_PAGE = ("<html><head><title>Ostmar</title><style>p {color: red}</style><script>var secret = 1;</script></head>"
               "<body><h1>Ostmar</h1><p>Ostmar is the capital   of Veltria.</p><div>It lies on the Quell.</div>"
               "<noscript>enable scripts</noscript></body></html>")


class StubPages(BaseHTTPRequestHandler):
    """Web pages on 127.0.0.1: path -> (status, content type, body, delay in seconds)."""

    routes: dict = {}
    requests: list = []

    def do_GET(self):  # noqa: N802 -- http.server's name
        StubPages.requests.append(self.path)
        status, content_type, body, delay = StubPages.routes.get(self.path, (404, "text/plain", b"not found", 0))
        time.sleep(delay)
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


@pytest.fixture()
def pages():
    StubPages.requests = []
    StubPages.routes = {
        "/ostmar.html": (200, "text/html; charset=utf-8", OSTMAR_PAGE.encode(), 0),
        "/notes.txt": (200, "text/plain; charset=latin-1", "Quell: 300 km, café".encode("latin-1"), 0),
        "/big.txt": (200, "text/plain", b"x" * 5000, 0),
        "/slow.html": (200, "text/html", b"<p>late</p>", 3),
        "/logo.png": (200, "image/png", b"\x89PNG", 0),
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubPages)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_pages_are_fetched_as_text_within_their_limits(pages):
    from verl.workers.tools.search_backends import fetch_page_text, html_to_text

    assert fetch_page_text(f"{pages}/ostmar.html", 5, 10_000) == (
        "Ostmar\nOstmar\nOstmar is the capital of Veltria.\nIt lies on the Quell.")  # no script, style, noscript
    assert fetch_page_text(f"{pages}/notes.txt", 5, 10_000) == "Quell: 300 km, café"  # the page's charset
    assert fetch_page_text(f"{pages}/big.txt", 5, 1000) == "x" * 1000  # read no more than max_bytes
    start = time.monotonic()
    with pytest.raises(ToolError, match="slow.html: TimeoutError"):
        fetch_page_text(f"{pages}/slow.html", 0.3, 1000)
    assert time.monotonic() - start < 2
    with pytest.raises(ToolError, match="content type image/png is not text"):
        fetch_page_text(f"{pages}/logo.png", 5, 1000)
    with pytest.raises(ToolError, match="missing.html: HTTP 404"):
        fetch_page_text(f"{pages}/missing.html", 5, 1000)
    with pytest.raises(ToolError, match="only http and https"):
        fetch_page_text("file:///etc/passwd", 5, 1000)
    assert html_to_text("<ul><li>a &amp; b</li><li>c</li></ul>") == "a & b\nc"


def summarise(messages: list[dict]) -> str:
    prompt = messages[0]["content"]
    return f"Summary ({prompt.count(chr(10) + 'Page ')} pages): Ostmar is the capital."


def test_summaries_of_the_top_pages_are_cached(serp, pages, tmp_path):
    from openai_stub import OpenAIStub

    StubSERP.body = json.dumps({"organic": [
        {"description": "Ostmar snippet", "link": f"{pages}/ostmar.html"},
        {"description": "Broken page snippet", "link": f"{pages}/missing.html"},
        {"description": "No link snippet"},
        {"description": "Fourth result, not summarised", "link": f"{pages}/notes.txt"}]})
    cache = tmp_path / "search_cache.json"
    with OpenAIStub(reply=summarise, model="summariser") as stub:
        params = dict(backend="http", api_key="k", zone="z", endpoint=serp, cache_file=str(cache),
                      summary={"base_url": stub.url, "model": "summariser", "max_retries": 0}, summary_pages=3,
                      page_chars=25)
        tool = SearchTool(**params)
        assert tool.execute('capital of "Veltria"') == "Summary (3 pages): Ostmar is the capital."
        (request,) = stub.chat_requests
        assert request["model"] == "summariser" and request["temperature"] == 0.0 and request["max_tokens"] == 1024
        prompt = request["messages"][0]["content"]
        assert prompt.startswith("You help a researcher who searched the web for: capital of Veltria\n")
        assert f"Page 1 ({pages}/ostmar.html):\nOstmar\nOstmar\nOstmar is t\n\n" in prompt  # cut to page_chars
        assert f"Page 2 ({pages}/missing.html):\nBroken page snippet\n\n" in prompt  # a failed fetch: the snippet
        assert prompt.endswith("Page 3 (search result):\nNo link snippet")
        assert "secret" not in prompt and "Fourth" not in prompt
        assert sorted(StubPages.requests) == ["/missing.html", "/ostmar.html"] and len(StubSERP.requests) == 1

        # Asked again, by this tool or by a new one (another worker, a rerun): no search, no page, no summariser.
        assert tool.execute("capital of Veltria") == "Summary (3 pages): Ostmar is the capital."
        assert SearchTool(**params).execute("capital  of Veltria") == "Summary (3 pages): Ostmar is the capital."
        assert len(StubSERP.requests) == 1 and len(StubPages.requests) == 2 and len(stub.requests) == 1
        saved = json.loads(cache.read_text(encoding="utf-8"))
        assert saved == {"capital of Veltria": "Page 1: Ostmar snippet\nPage 2: Broken page snippet\nPage 3: No link "
                                               "snippet\nPage 4: Fourth result, not summarised",
                         '["summary", "summariser", "capital of Veltria"]': "Summary (3 pages): Ostmar is the capital."}


def test_summaries_offline_and_from_a_bm25_corpus(pages, tmp_path, monkeypatch):
    from openai_stub import OpenAIStub

    corpus = write_corpus(tmp_path / "corpus.jsonl", [
        {"title": "Ostmar", "text": "Ostmar is a city.", "url": f"{pages}/ostmar.html"},
        {"title": "Quell", "text": "The Quell is a river.", "url": f"{pages}/notes.txt"}])
    with OpenAIStub(reply=summarise) as stub:
        summary = {"base_url": stub.url, "model": "s", "max_retries": 0}
        tool = SearchTool(corpus_path=corpus, summary=summary, summary_pages=1)
        assert tool.execute("Ostmar city") == "Summary (1 pages): Ostmar is the capital."
        assert StubPages.requests == ["/ostmar.html"] and "Ostmar is the capital of Veltria." in (
            stub.chat_requests[0]["messages"][0]["content"])
        assert tool.execute("zebra") == NO_RESULTS and len(stub.chat_requests) == 1

        # No search credentials, only the seed's query cache: the cached snippets are summarised.
        cache = tmp_path / "search_cache.json"
        cache.write_text(json.dumps({"largest lake": "Page 1: Lake Narn is the largest."}))
        offline = SearchTool(backend="http", cache_file=str(cache), summary=summary)
        offline.execute("largest lake")
        assert "Page 1 (search results):\nPage 1: Lake Narn is the largest." in (
            stub.chat_requests[-1]["messages"][0]["content"])


def test_a_failing_summariser_is_a_tool_error_and_nothing_is_cached(serp, pages, tmp_path):
    from openai_stub import OpenAIStub

    StubSERP.body = json.dumps({"organic": [{"description": "snippet", "link": f"{pages}/ostmar.html"}]})
    cache = tmp_path / "search_cache.json"
    with OpenAIStub(reply=summarise) as stub:
        stub.status = 500
        tool = SearchTool(backend="http", api_key="k", zone="z", endpoint=serp, cache_file=str(cache),
                          summary={"base_url": stub.url, "model": "s", "max_retries": 1})
        with pytest.raises(ToolError, match=r"the page summariser failed: .*HTTP 500 after 1 retries") as err:
            tool.execute("query")
        assert not err.value.retryable and len(stub.chat_requests) == 2  # the endpoint retried already
        assert list(json.loads(cache.read_text())) == ["query"]  # the snippets, not a summary
    with pytest.raises(ValueError, match="search tool: search tool param summary.base_url is not set"):
        SearchTool(corpus_path=write_corpus(tmp_path / "c.jsonl", CORPUS), summary={"model": "s"})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['temperature'\]"):
        SearchTool(corpus_path=write_corpus(tmp_path / "c.jsonl", CORPUS),
                   summary={"base_url": "http://127.0.0.1:9", "temperature": 0})
