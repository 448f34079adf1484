"""The search tool: BM25 over a local corpus, the HTTP backend against a local stub server, the shared cache."""

from __future__ import annotations

import json
import multiprocessing
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from verl.workers.tools import ToolError
from verl.workers.tools.search_tool import NO_RESULTS, QueryCache, SearchTool, format_results, normalize_query

CORPUS = [
    {"id": "1", "title": "Veltria", "text": "The capital of Veltria is Ostmar, a city on the river Quell."},
    {"id": "2", "title": "Ostmar", "text": "Ostmar has a population of 120000 people."},
    {"id": "3", "title": "Cats", "text": "Cats sleep for most of the day."},
]


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    return str(path)


def test_bm25_ranks_the_matching_passage_first(corpus):
    tool = SearchTool(corpus_path=corpus, max_results=2, result_length=40)
    lines = tool.execute("capital of Veltria").splitlines()
    assert lines[0] == "Page 1: " + "Veltria: The capital of Veltria is Ostmar, a city"[:40]  # title: text, cut
    assert len(lines) <= 2 and all(line.startswith(f"Page {k}: ") for k, line in enumerate(lines, 1))
    assert tool.execute("population Ostmar").startswith("Page 1: Ostmar: Ostmar has a population")
    assert tool.execute("zebra quantum") == NO_RESULTS


def test_formatting_and_query_normalisation():
    assert format_results(["a", " a ", "", "b", "c"], max_results=2, result_length=10) == "Page 1: a\nPage 2: b"
    assert format_results([], 3, 10) == NO_RESULTS
    assert normalize_query('  "capital"   of\nX ') == "capital of X"


def test_bad_params_are_named(tmp_path):
    with pytest.raises(ValueError, match="corpus_path=None"):
        SearchTool()
    with pytest.raises(ValueError, match="backend='bing' must be bm25 or http"):
        SearchTool(backend="bing")
    with pytest.raises(ValueError, match="SEARCH_API_KEY"):
        SearchTool(backend="http")
    with pytest.raises(ToolError, match="empty search query"):
        SearchTool(corpus_path=_write(tmp_path, CORPUS)).execute('  " ')


def _write(tmp_path, rows):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


class StubSERP(BaseHTTPRequestHandler):
    requests: list = []
    status = 200

    def do_POST(self):  # noqa: N802 -- http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StubSERP.requests.append((dict(self.headers), body))
        self.send_response(StubSERP.status)
        self.end_headers()
        organic = [{"description": "Ostmar is the capital."}, {"description": ""}, {"title": "no description"}]
        self.wfile.write(json.dumps({"organic": organic}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture()
def serp():
    server = HTTPServer(("127.0.0.1", 0), StubSERP)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    StubSERP.requests, StubSERP.status = [], 200
    yield f"http://127.0.0.1:{server.server_port}/request"
    server.shutdown()


def test_http_backend_against_a_local_stub(serp, monkeypatch):
    monkeypatch.setenv("SEARCH_API_KEY", "k123")
    tool = SearchTool(backend="http", zone="serp_zone", endpoint=serp, location="cn")
    assert tool.execute("capital of Veltria") == "Page 1: Ostmar is the capital."
    headers, body = StubSERP.requests[0]
    assert headers["Authorization"] == "Bearer k123" and body["zone"] == "serp_zone" and body["format"] == "raw"
    assert body["url"].startswith("https://www.bing.com/search?q=capital+of+Veltria&mkt=en-US&setLang=en")
    assert "cc=cn" in body["url"] and "brd_json=1" in body["url"]
    assert "mkt=zh-CN" in tool.backend.search_url("首都")

    StubSERP.status = 500
    with pytest.raises(ToolError) as err:
        tool.execute("another query")
    assert err.value.retryable


def test_cache_hits_skip_the_backend(serp, tmp_path):
    cache = tmp_path / "cache" / "search_cache.json"
    tool = SearchTool(backend="http", api_key="k", zone="z", endpoint=serp, cache_file=str(cache))
    first = tool.execute('capital  of "Veltria"')
    assert tool.execute("capital of Veltria") == first and len(StubSERP.requests) == 1
    assert json.loads(cache.read_text(encoding="utf-8")) == {"capital of Veltria": first}
    # A new process (a new tool) reads the file.
    again = SearchTool(backend="http", api_key="k", zone="z", endpoint=serp, cache_file=str(cache))
    assert again.execute("capital of Veltria") == first and len(StubSERP.requests) == 1


def _writer(path: str, worker: int, queries: int) -> None:
    cache = QueryCache(path, refresh_interval_s=0.0)
    for q in range(queries):
        cache.put(f"query {worker}-{q}", f"result {worker}-{q} " + "x" * 50)


def test_cache_under_concurrent_writers_from_several_processes_loses_no_entry(tmp_path):
    path = str(tmp_path / "shared.json")
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_writer, args=(path, w, 25)) for w in range(4)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    entries = json.loads(open(path, encoding="utf-8").read())
    assert len(entries) == 100
    assert entries["query 3-24"].startswith("result 3-24 ")
