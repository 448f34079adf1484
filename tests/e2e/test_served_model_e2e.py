"""Everything against one real vLLM server of the tiny tool model (a server start costs a minute on 2 cores, so the
tests that need one share it):

- the endpoint engine (verl/workers/rollout/openai_rollout.py): the HF engine's greedy tokens and tool-loop
  trajectories, seeded sampling;
- ARPO's evaluation launcher (scripts/eval/infer_local_sds.sh) on two tiny local data sets, with the same server as
  the LLM judge: the tool loop runs through the endpoint (real python calls), main_eval grades with rules and the
  judge, and the per-data-set table holds exactly what the per-response scores say;
- the search tool's page summaries by the served model."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess

import numpy as np
import pandas as pd
import pytest
from served_model import serve
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.demo.tool_tasks import make_messages, make_tool_arithmetic_rows
from verl.utils.openai_endpoint import Endpoint, EndpointConfig
from verl.workers.config.rollout import BranchingConfig
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.openai_rollout import OpenAIRollout
from verl.workers.rollout.tool_rounds import RESULT_TEMPLATE, ToolRoundLoop
from verl.workers.tools.manager import ToolManager

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATASETS = {"products": (4, 3), "small_products": (2, 2)}  # name -> digits of the two factors
N_SAMPLES = 2


@pytest.fixture(scope="module")
def served(tiny_tool_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm_server") / "server.log"
    with serve(tiny_tool_model_dir, str(log)) as server:
        yield server


# ------------------------------------------------------------------------------------------------ endpoint engine
PYTHON_TOOL = {
    "call_limit": 2,
    "tool_instances": {
        "python": {"class_path": "verl.workers.tools.python_tool.PythonTool", "params": {"timeout_s": 10}}
    },
}


@pytest.fixture(scope="module")
def endpoint(served, tiny_tool_model_dir):
    """(tokenizer, HF engine, endpoint engine, chat prompts of tool-arithmetic questions) on the served model."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_tool_model_dir)
    hf = HFRollout(AutoModelForCausalLM.from_pretrained(tiny_tool_model_dir), tokenizer, seed=0)
    config = {"endpoint": {"base_url": served.url, "timeout_s": 60}, "ignore_eos": False}
    engine = OpenAIRollout.build(model_path=tiny_tool_model_dir, tokenizer=tokenizer, config=config, device="cpu",
                                 seed=0, load_module=None, weights_follow=False)
    questions = [row["extra_info"]["question"] for row in make_tool_arithmetic_rows(3, "test")]
    prompts = [tokenizer.apply_chat_template(make_messages(q), add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"] for q in questions]
    return tokenizer, hf, engine, prompts + [tokenizer.encode("The quick brown fox")]


def test_the_served_model_is_discovered(endpoint):
    _, _, engine, _ = endpoint
    assert engine.endpoint.model == "tiny"


@pytest.mark.parametrize("stop", [None, ["</python>"], ["<result>", "print"]])
def test_greedy_tokens_equal_the_hf_engine(endpoint, stop):
    """Token for token, with the same finish and stop reasons; the stop string's last token is kept, as in HF."""
    tokenizer, hf, engine, prompts = endpoint
    params = SamplingParams(temperature=0, max_tokens=48, stop=stop)
    expected, got = hf.generate(prompts, params), engine.generate(prompts, params)
    for want, have in zip(expected, got):
        assert len(have) == 1
        assert have[0].token_ids == want[0].token_ids
        assert (have[0].finish_reason, have[0].stop_reason) == (want[0].finish_reason, want[0].stop_reason)
    if stop == ["</python>"]:  # the tool model's calls end every chat prompt's segment
        assert [out[0].stop_reason for out in got[:3]] == ["</python>"] * 3
        assert tokenizer.decode(got[0][0].token_ids).endswith("</python>")


def test_the_tool_loop_through_the_endpoint_is_the_hf_engines(endpoint):
    """The same agent loop on both engines: identical trajectories, the python tool's output appended (mask 0)."""
    tokenizer, hf, engine, prompts = endpoint
    runs = []
    for rollout in (hf, engine):
        tools = ToolManager.from_config(PYTHON_TOOL)
        loop = ToolRoundLoop(rollout, tokenizer, tools, BranchingConfig(), seed=0)
        groups, metrics = loop.run(
            prompts[:3], n=1, params=SamplingParams(temperature=0), response_length=120, branching=False
        )
        tools.close()
        runs.append(([g[0] for g in groups], metrics))
    (expected, _), (got, metrics) = runs
    assert [t.response for t in got] == [t.response for t in expected]
    assert [t.mask for t in got] == [t.mask for t in expected]
    assert metrics["tools/calls_per_trajectory"] >= 1
    for traj in got:
        text = tokenizer.decode(traj.response, skip_special_tokens=True)
        a, b = re.search(r"<python>print\((\d+) \* (\d+)\)</python>", text).groups()  # the tiny model's call
        product = int(a) * int(b)
        assert RESULT_TEMPLATE.format(product) in text
        result_ids = tokenizer.encode(RESULT_TEMPLATE.format(product), add_special_tokens=False)
        start = traj.mask.index(0)
        assert traj.response[start : start + len(result_ids)] == result_ids
        assert traj.mask[start : start + len(result_ids)] == [0] * len(result_ids)


def test_sampling_is_seeded_per_request(endpoint):
    """n samples differ; the same seed and requests give the same samples again; the log-probs are not measured."""
    _, _, engine, prompts = endpoint
    params = SamplingParams(n=4, temperature=1.0, max_tokens=24)
    first, again = (
        OpenAIRollout(Endpoint(EndpointConfig(base_url=engine.endpoint.url, model="tiny")), seed=0).generate(
            prompts[:2], params)
        for _ in range(2)
    )
    assert [[o.token_ids for o in group] for group in again] == [[o.token_ids for o in group] for group in first]
    assert len({tuple(o.token_ids) for o in first[0]}) > 1
    assert all(math.isnan(lp) for o in first[0] for lp in o.log_probs)


# ------------------------------------------------------------------------------------------------ evaluation
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


# ------------------------------------------------------------------------------------------------ generative RM
def test_grpo_with_a_served_generative_reward_model(served, ray_session, tiny_tool_model_dir, arithmetic_data_dir,
                                                    tmp_path):
    """verl 0.9's reward loop with a generative reward model (reward_model.rollout.name=vllm): no reward-model
    workers; the reward function (judge_reward.py) gets the server's address as reward_router_address and asks the
    served model to judge every response. main_ppo serves the model itself (model_server.serve_reward_model, one
    server start); here the module's server stands in for it, handed over as main_ppo hands it."""
    from e2e_utils import build_trainer, tiny_overrides

    log = open(served.log_path, errors="replace")
    log.seek(0, os.SEEK_END)
    trainer = build_trainer(tiny_overrides(
        tiny_tool_model_dir, arithmetic_data_dir, "reward_model.enable=true", "reward_model.use_reward_loop=true",
        f"reward_model.model.path={tiny_tool_model_dir}", "reward_model.rollout.name=vllm",
        f"custom_reward_function.path={REPO}/verl/utils/reward_score/judge_reward.py",
        "+custom_reward_function.reward_kwargs.max_tokens=8", "trainer.total_training_steps=2",
        f"trainer.default_local_dir={tmp_path}"), tiny_tool_model_dir, reward_server=served)
    try:
        assert trainer.plan.reward_model_server == "vllm" and not trainer.plan.use_reward_model
        assert trainer.rm_wg is None
        history = trainer.fit()
    finally:
        trainer.shutdown()
    assert [m["training/global_step"] for m in history] == [1, 2]
    assert all(np.isfinite(m["critic/score/mean"]) and np.isfinite(m["actor/pg_loss"]) for m in history)
    judged = log.read().count("POST /v1/chat/completions")
    assert judged >= 2 * 8 * 4  # every response of both steps went to the served judge (rule checks aside)
