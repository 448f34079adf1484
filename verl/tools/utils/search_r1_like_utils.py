"""verl's `verl.tools.utils.search_r1_like_utils`: the client of a Search-R1 retrieval server, which verl's search
tool (`verl/tools/search_tool.py`, and users' copies of it) calls for each `query_list`.

The server (Search-R1's retrieval server, e.g. an E5 index over Wikipedia at http://127.0.0.1:8000/retrieve) takes a
POST of `{"queries": [...], "topk": k, "return_scores": true}` and answers `{"result": [[hit, ...], ...]}`, one list
per query, each hit `{"document": {"contents": "<title>\\n<text>"}, "score": s}`. `perform_single_search_batch`
writes what the model reads, one block per hit and the queries' blocks joined by a `---` line:

    Doc 1 (Title: <title>)
    <text>

as the JSON `{"result": <that text>}`, with a metadata dict whose `status` is success, no_results, api_error or
processing_error. Quiver's own search tool (verl/workers/tools/search_tool.py) uses other backends.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

DEFAULT_TIMEOUT = 30  # seconds one request may take
MAX_ATTEMPTS = 10  # attempts of one request when the server is unreachable, slow, or answers 5xx
RETRY_DELAY_S = 1.0  # the wait before attempt k + 1 is k * RETRY_DELAY_S
RETRY_STATUSES = (500, 502, 503, 504)


def call_search_api(retrieval_service_url: str, query_list: list[str], topk: int = 3, return_scores: bool = True,
                    timeout: float = DEFAULT_TIMEOUT) -> tuple[dict[str, Any] | None, str | None]:
    """(the server's JSON answer, None), or (None, why the request failed after its attempts)."""
    body = json.dumps({"queries": list(query_list), "topk": topk, "return_scores": return_scores}).encode()
    request = urllib.request.Request(retrieval_service_url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    error = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read()), None
        except urllib.error.HTTPError as err:  # before URLError, its base class
            error = f"HTTP {err.code} {err.reason} from {retrieval_service_url}"
            if err.code not in RETRY_STATUSES:
                break
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:  # down or slow: another try may work
            error = f"cannot reach {retrieval_service_url}: {getattr(err, 'reason', err)}"
        except json.JSONDecodeError as err:
            return None, f"the answer of {retrieval_service_url} is not JSON ({err.msg} at character {err.pos})"
        if attempt < MAX_ATTEMPTS:
            time.sleep(RETRY_DELAY_S * attempt)
    return None, f"API Call Failed: {error} ({attempt} attempt{'s' if attempt > 1 else ''})"


def passages_text(hits: list[dict[str, Any]]) -> str:
    """The hits of one query as `Doc i (Title: ...)` blocks; a hit's contents are its title line, then its text."""
    blocks = []
    for index, hit in enumerate(hits, start=1):
        title, _, text = hit["document"]["contents"].partition("\n")
        blocks.append(f"Doc {index} (Title: {title})\n{text}")
    return "\n\n".join(blocks).strip()


def perform_single_search_batch(retrieval_service_url: str, query_list: list[str], topk: int = 3,
                                concurrent_semaphore: threading.Semaphore | None = None,
                                timeout: float = DEFAULT_TIMEOUT) -> tuple[str, dict[str, Any]]:
    """Search every query of `query_list` in one request: (the JSON text the model reads, metadata). A failure is
    a result text saying so, never an exception; `concurrent_semaphore`, when given, is held during the request."""
    with concurrent_semaphore or contextlib.nullcontext():
        response, error = call_search_api(retrieval_service_url, query_list, topk=topk, timeout=timeout)
    metadata = {"query_count": len(query_list), "queries": query_list, "api_request_error": error,
                "api_response": response, "status": "api_error", "total_results": 0, "formatted_result": None}
    if error:
        return json.dumps({"result": f"Search error: {error}"}, ensure_ascii=False), metadata
    results = response.get("result") if isinstance(response, dict) else None
    if not results:
        metadata["status"] = "no_results"
        return json.dumps({"result": "No search results found."}, ensure_ascii=False), metadata
    try:
        text = "\n---\n".join(passages_text(hits) for hits in results)
    except (KeyError, TypeError, AttributeError) as err:  # hits not shaped as the module docstring says
        metadata["status"] = "processing_error"
        return json.dumps({"result": f"Error processing search results: {err!r}"}, ensure_ascii=False), metadata
    metadata.update(status="success", total_results=sum(len(hits) for hits in results), formatted_result=text)
    return json.dumps({"result": text}, ensure_ascii=False), metadata
