"""The search tool: BM25 over a local corpus, the HTTP backend against a local stub server, the shared query cache."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verl.workers.tools import ToolError, ToolManager
from verl.workers.tools.search_backends import API_KEY_ENV, ZONE_ENV
from verl.workers.tools.search_tool import NO_RESULTS, QueryCache, SearchTool, format_results, normalize_query

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
    other = QueryCache(str(path))
    other.put("cats", "Page 1: from another writer")
    assert tool.execute("cats") == "Page 1: from another writer"
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert set(saved) == {"capital of Veltria", "cats"}
    assert "中文" in path.read_text(encoding="utf-8")  # ensure_ascii=False


def test_an_unreadable_cache_file_is_rewritten(tmp_path, caplog):
    path = tmp_path / "search_cache.json"
    path.write_text("{not json")
    cache = QueryCache(str(path))
    cache.put("q", "Page 1: a")
    assert json.loads(path.read_text()) == {"q": "Page 1: a"} and "unreadable" in caplog.text
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]  # no temporary file left


def test_cache_under_concurrent_threads(tmp_path):
    path = str(tmp_path / "search_cache.json")
    caches = [QueryCache(path, refresh_interval_s=0.0) for _ in range(2)]  # two tools in one process

    def write(worker):
        for q in range(20):
            caches[worker % 2].put(f"query {worker}-{q}", f"result {worker}-{q}")
            assert caches[worker % 2].get(f"query {worker}-{q}") == f"result {worker}-{q}"

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(json.loads(open(path, encoding="utf-8").read())) == 160


def _writer(path: str, worker: int, queries: int, start) -> None:
    cache = QueryCache(path, refresh_interval_s=0.0)
    start.wait()  # all writers at once (without the file lock this loses entries)
    for q in range(queries):
        cache.put(f"query {worker}-{q}", f"result {worker}-{q} " + "é" * 50)


def test_cache_under_concurrent_writers_from_several_processes_loses_no_entry(tmp_path):
    path = str(tmp_path / "shared" / "search_cache.json")
    os.makedirs(os.path.dirname(path))
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(4)
    writers = [context.Process(target=_writer, args=(path, w, 25, start)) for w in range(4)]
    for process in writers:
        process.start()
    reads = 0
    while any(process.is_alive() for process in writers):  # a reader without the lock always sees valid JSON
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                assert isinstance(json.load(f), dict)
            reads += 1
        time.sleep(0.005)
    for process in writers:
        process.join(60)
        assert process.exitcode == 0
    entries = json.loads(open(path, encoding="utf-8").read())
    assert len(entries) == 100 and reads > 0
    assert entries == {f"query {w}-{q}": f"result {w}-{q} " + "é" * 50 for w in range(4) for q in range(25)}
    assert sorted(os.listdir(os.path.dirname(path))) == ["search_cache.json", "search_cache.json.lock"]


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
