"""End to end: ARPO's evaluation launcher (scripts/eval/infer_local_sds.sh) against a real vLLM server of the tiny
tool model, on two tiny local data sets, with the same server as the LLM judge: the tool loop runs through the
endpoint (real python calls), main_eval grades with rules and the judge, and the per-data-set table holds exactly what
the per-response scores say."""

from __future__ import annotations

import json
import os
import re
import subprocess

import numpy as np
import pandas as pd
import pytest
from served_model import serve

from verl.demo.tool_tasks import make_tool_arithmetic_rows

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATASETS = {"products": (4, 3), "small_products": (2, 2)}  # name -> digits of the two factors
N_SAMPLES = 2


@pytest.fixture(scope="module")
def served(tiny_tool_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm_server") / "server.log"
    with serve(tiny_tool_model_dir, str(log)) as server:
        yield server


@pytest.fixture(scope="module")
def evaluation(served, tiny_tool_model_dir, tmp_path_factory):
    """(output dir, launcher stdout, rows per data set) of one launcher run: 3 questions per set, 2 samples each."""
    root = tmp_path_factory.mktemp("served_eval")
    data_dir, out_dir = root / "data", root / "out"
    data_dir.mkdir()
    rows = {}
    for name, digits in DATASETS.items():
        rows[name] = make_tool_arithmetic_rows(3, "test", digits=digits)
        pd.DataFrame(rows[name]).to_parquet(data_dir / f"{name}.parquet")
    tool_config = root / "python_tool.yaml"
    tool_config.write_text(
        "call_limit: 2\ntool_instances:\n  python:\n"
        "    class_path: verl.workers.tools.python_tool.PythonTool\n    params: {timeout_s: 10}\n"
    )
    env = {
        **os.environ,
        "BASE_URL": served.url,
        "MODEL_NAME": served.model,
        "MODEL_PATH": tiny_tool_model_dir,
        "DATA_DIR": str(data_dir),
        "OUTPUT_DIR": str(out_dir),
        "DATASETS": ",".join(DATASETS),
        "N_SAMPLES": str(N_SAMPLES),
        "TEMPERATURE": "0.6",
        "PROMPT_LENGTH": "256",
        "RESPONSE_LENGTH": "128",
        "TOOL_CONFIG": str(tool_config),
        "CONCURRENCY": "4",
        "JUDGE_BASE_URL": served.url,
        "JUDGE_MODEL": served.model,
        "JUDGE_MAX_TOKENS": "8",
        "GRADING_WORKERS": "0",
    }
    run = subprocess.run(
        ["bash", os.path.join(REPO, "scripts/eval/infer_local_sds.sh")],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"launcher failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    return out_dir, run.stdout, rows


def pass_at_n(groups) -> float:
    """pass@n with n = every sample of a prompt: the share of prompts with a correct one (score >= 1)."""
    return float(np.mean([max(group) >= 1.0 for group in groups]))


def test_the_table_has_a_row_per_data_set_from_the_scores(evaluation):
    out_dir, stdout, rows = evaluation
    table = json.loads((out_dir / "table.json").read_text())
    assert list(table) == list(DATASETS)
    for name, row in table.items():
        scored = pd.read_parquet(out_dir / "scores" / f"{name}.parquet")
        rule = [list(group) for group in scored["scores"]]
        judge = [list(group) for group in scored["judge_scores"]]
        assert row["prompts"] == len(rows[name]) and row["k"] == N_SAMPLES
        assert row["avg@k"] == pytest.approx(np.mean(rule))
        assert row["pass@k"] == pytest.approx(pass_at_n(rule))
        assert row["judge avg@k"] == pytest.approx(np.mean(judge))
        assert row["judge pass@k"] == pytest.approx(pass_at_n(judge))
        assert row["tool calls"] > 0
    markdown = (out_dir / "table.md").read_text().splitlines()
    assert markdown[0].startswith("| data_source | prompts | k | avg@k | pass@k | judge avg@k | judge pass@k |")
    assert [line.split(" | ")[0] for line in markdown[2:]] == [f"| {name}" for name in DATASETS]
    assert all(name in stdout for name in DATASETS) and "wrote" in stdout.splitlines()[-1]


def test_the_responses_went_through_the_tool_loop_on_the_server(evaluation):
    out_dir, _, rows = evaluation
    for name in DATASETS:
        generated = pd.read_parquet(out_dir / "generations" / f"{name}.parquet")
        assert len(generated) == len(rows[name])
        calls = 0
        for responses in generated["responses"]:
            assert len(responses) == N_SAMPLES
            for text in responses:
                for a, b, result in re.findall(
                    r"<python>print\((\d+) \* (\d+)\)</python> <result>\n(.*?)\n</result>", text
                ):
                    assert int(result) == int(a) * int(b)  # the sandboxed python tool's output, appended
                    calls += 1
        assert calls > 0


def test_search_summaries_come_from_the_served_model_and_are_cached(served, tmp_path):
    """The search tool's page summaries with the served tiny model as the summariser: a page on a local HTTP server
    is fetched and its text reaches the model (vLLM's chat endpoint answers), and asking again is served from the
    cache: no page fetch and no request to the server."""
    import functools
    import http.server
    import threading

    from verl.workers.tools.search_tool import SearchTool

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "ostmar.html").write_text("<html><body><p>Ostmar is the capital of Veltria.</p></body></html>")
    fetched = []

    class Pages(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            fetched.append(self.path)

    handler = functools.partial(Pages, directory=str(tmp_path / "site"))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as site:
        threading.Thread(target=site.serve_forever, daemon=True).start()
        corpus = tmp_path / "corpus.jsonl"
        page_url = f"http://127.0.0.1:{site.server_address[1]}/ostmar.html"
        corpus.write_text(json.dumps({"title": "Ostmar", "text": "Ostmar is a city.", "url": page_url}) + "\n")
        params = dict(corpus_path=str(corpus), cache_file=str(tmp_path / "cache.json"), summary_pages=1,
                      summary_max_tokens=16, summary={"base_url": served.url, "model": served.model})
        first = SearchTool(**params).execute("Ostmar city")
        assert fetched == ["/ostmar.html"]
        assert first.strip()
        cached = SearchTool(**params).execute("Ostmar city")
        site.shutdown()
    assert cached == first and fetched == ["/ostmar.html"]
    with open(tmp_path / "cache.json") as f:
        assert first in json.load(f).values()
