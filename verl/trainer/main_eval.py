"""Offline scoring of responses already in a file: `python -m verl.trainer.main_eval data.path=gen.parquet k=v ...`.

Each row of `data.path` holds a prompt's N responses (`data.response_key`, the `responses` column that
main_generation writes); every response is graded by the scorer of the row's data source (or
`custom_reward_function`) in `num_workers` worker processes, each under `timeout_s`, so code problems are graded in
parallel and a grader that hangs costs one response its score, not the run. Reported, as main_generation does:
avg@N and pass@k per data source (`verl/trainer/ppo/eval_metrics.py`), printed and written as JSON, plus the share of
responses per grading status (ok, a scorer's own `reward_status` such as wrong_answer or no_code_block, or a failure: exception,
not_a_number, non_finite, grading_timeout).

With `judge.enable=true` an LLM judge on an OpenAI-compatible server grades every response as well (ARPO's
`llm_equal`; verl/utils/reward_score/llm_judge.py): the question (each row's `extra_info.question`, else the last
user message of its prompt), the reference answers and the response's final answer go to the judge, which says
Correct or Incorrect. Then avg@N and pass@k per data source are the judge's, the rule scores stay alongside as
`rule/avg@N`, `rule/pass@k`, and the share of responses per judge status (rule_equal, judge_correct,
judge_incorrect, judge_unparsed, no_answer) is reported too. The judge's replies are cached (`judge.cache_path`), so
a rerun asks the server nothing it asked before.

The metrics go to `<name>.metrics.json` and the table also to `<name>.metrics.md` (Markdown).

Use it to re-grade a generation with other scorer settings, to grade generations made elsewhere (e.g. by vLLM), or
to check a scorer against reference solutions. `run_eval(config)` does the job in-process and returns the metrics.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import DictConfig
from tqdm import tqdm

from verl.trainer.config import run_cli
from verl.trainer.config.evaluation import EvaluationConfig, JudgeConfig
from verl.trainer.ppo.eval_metrics import compute_eval_metrics, format_metrics_table, merge_metrics
from verl.trainer.ppo.reward import default_score_fn, get_custom_reward_fn, grading_timeout_s
from verl.utils.config import ConfigError
from verl.utils.dataset.rl_dataset import read_rows
from verl.utils.json_cache import JsonCache
from verl.utils.openai_endpoint import Endpoint, EndpointError
from verl.utils.reward_score.arpo_eval import task_of
from verl.utils.reward_score.deep_research import ground_truth_list
from verl.utils.reward_score.llm_judge import JudgeItem, LLMJudge, Verdict
from verl.utils.timed_pool import TimedProcessPool
from verl.utils.typed_config import build_section, check_config_types
from verl.workers.reward_manager.isolation import ScoreChecker, call_isolated, describe_function, from_pool

STATUS_TABLES = ("grading_status", "judge_status")  # share of responses per status, not per data source


def _as_list(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def check_eval_config(config: DictConfig) -> EvaluationConfig:
    """The typed config, or one ConfigError listing every problem (naming the keys). Each section checks its own
    keys (verl/trainer/config/evaluation.py); no rule spans sections."""
    problems: list[str] = []
    typed = build_section(EvaluationConfig, check_config_types(EvaluationConfig, config), problems)
    if problems:
        raise ConfigError("the evaluation config has problems:\n  - " + "\n  - ".join(problems))
    return typed


def load_responses(config: DictConfig) -> tuple[list[dict], list[list[str]]]:
    """The rows of `data.path` (a file, checked by `check_eval_config`) and each row's responses; a ConfigError
    names the column or row at fault."""
    data = config.data
    rows = read_rows(os.path.expanduser(data.path))
    if not rows:
        raise ConfigError(f"data.path={data.path} has no rows")
    for key in ("response_key", "data_source_key", "reward_model_key"):
        column = data[key]
        if column not in rows[0]:
            raise ConfigError(f"data.{key}={column}: no such column in {data.path} (columns: {sorted(rows[0])})")

    responses = []
    for i, row in enumerate(rows):
        value = _as_list(row[data.response_key])
        group = [value] if isinstance(value, str) else value
        if not isinstance(group, list) or not group or not all(isinstance(r, str) for r in group):
            raise ConfigError(f"{data.path} row {i}: column {data.response_key!r} must hold a non-empty list of "
                              f"response strings, not {type(value).__name__}")
        responses.append(group)
    sizes = {len(group) for group in responses}
    if len(sizes) != 1:
        raise ConfigError(f"{data.path}: every row needs the same number of responses; found {sorted(sizes)}")
    return rows, responses


def grading_calls(config: DictConfig, rows: list[dict], responses: list[list[str]]) -> list[dict[str, Any]]:
    """One keyword dict of `compute_score` per response, row by row."""
    data = config.data
    calls = []
    for i, (row, group) in enumerate(zip(rows, responses)):
        reward_model = row[data.reward_model_key]
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise ConfigError(f"{data.path} row {i}: column {data.reward_model_key!r} must be a dict with "
                              "'ground_truth' (data.reward_model_key)")
        extra_info = row.get(data.extra_info_key) or {}
        for response in group:
            calls.append({"data_source": row[data.data_source_key], "solution_str": response,
                          "ground_truth": _as_list(reward_model["ground_truth"]), "extra_info": extra_info})
    return calls


def grade(config: DictConfig, calls: list[dict[str, Any]]) -> tuple[list[float], list[str]]:
    """(score, status) of every call, graded in worker processes. A grading that raises, times out or gives no
    finite number scores 0 with its failure status, the first of each kind printed (as in training:
    verl/workers/reward_manager/isolation.py); a scorer's own status (`reward_status`) is kept, else "ok"."""
    compute_score = get_custom_reward_fn(config) or default_score_fn(config, is_eval=True)
    num_workers = config.num_workers if config.num_workers is not None else min(8, os.cpu_count() or 1)
    timeout_s = config.timeout_s if config.timeout_s is not None else grading_timeout_s(config)

    if num_workers == 0:
        results = [call_isolated(compute_score, call) for call in tqdm(calls, desc="grading", unit="response")]
    else:
        pool = TimedProcessPool(compute_score, num_workers=num_workers, timeout_s=timeout_s)
        try:
            results = []
            chunk = max(num_workers * 4, 1)
            with tqdm(total=len(calls), desc=f"grading ({num_workers} workers)", unit="response") as bar:
                for start in range(0, len(calls), chunk):
                    batch = pool.map(calls[start : start + chunk])
                    results.extend(from_pool(batch))
                    bar.update(len(batch))
        finally:
            pool.close()

    checker = ScoreChecker(consequence="its grading_status is reported with the metrics.")
    rows, statuses = checker.check(results, [call["data_source"] for call in calls], describe_function(compute_score))
    return [row["score"] for row in rows], statuses


def question_of(row: dict, data: DictConfig, index: int) -> str:
    """The row's question: `extra_info.question` (what data/preprocess writes), else the last user message of the
    prompt column."""
    extra_info = row.get(data.extra_info_key) or {}
    if isinstance(extra_info, dict) and isinstance(extra_info.get("question"), str) and extra_info["question"].strip():
        return extra_info["question"]
    prompt = _as_list(row.get(data.prompt_key))
    if isinstance(prompt, str) and prompt.strip():
        return prompt
    users = [m.get("content") for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
    if users and isinstance(users[-1], str) and users[-1].strip():
        return users[-1]
    raise ConfigError(f"{data.path} row {index}: the judge needs the question, but there is no "
                      f"{data.extra_info_key}.question and no user message in column {data.prompt_key!r} "
                      "(data.extra_info_key, data.prompt_key)")


def judge_responses(config: DictConfig, judge_config: JudgeConfig, rows: list[dict], responses: list[list[str]],
                    cache_path: str) -> list[Verdict]:
    """The judge's verdict on every response, row by row (`verl/utils/reward_score/llm_judge.py`)."""
    data = config.data
    items = []
    for i, (row, group) in enumerate(zip(rows, responses)):
        references = tuple(ground_truth_list(_as_list(row[data.reward_model_key]["ground_truth"])))
        question = question_of(row, data, i)
        task = task_of(row.get(data.extra_info_key), row.get("ability"))
        items.extend(JudgeItem(question, references, response, task) for response in group)
    cache = JsonCache(cache_path, save_interval_s=5.0, what="judge cache")
    judge = LLMJudge(Endpoint(judge_config.endpoint()), cache, judge_config.temperature, judge_config.max_tokens)
    return judge.grade(items)


def run_eval(config: DictConfig) -> dict[str, dict[str, float]]:
    """Grade, write the metrics JSON (and the scored rows when data.output_path is set); return the metrics."""
    typed = check_eval_config(config)
    rows, responses = load_responses(config)
    n_samples = len(responses[0])
    calls = grading_calls(config, rows, responses)
    scores, statuses = grade(config, calls)

    data = config.data
    stem = os.path.splitext(data.output_path or data.path)[0]
    where = os.path.expanduser(data.metrics_path or stem + ".metrics.json")
    prompt_ids = [i for i in range(len(rows)) for _ in range(n_samples)]
    sources = [c["data_source"] for c in calls]
    metrics = compute_eval_metrics(sources, prompt_ids, scores, n_samples)
    columns = {"scores": scores}
    if typed.judge.enable:
        cache_path = typed.judge.cache_path or os.path.join(os.path.dirname(os.path.abspath(where)), "judge_cache.json")
        verdicts = judge_responses(config, typed.judge, rows, responses, os.path.expanduser(cache_path))
        columns["judge_scores"] = [float(v.correct) for v in verdicts]
        judged = compute_eval_metrics(sources, prompt_ids, columns["judge_scores"], n_samples)
        metrics = merge_metrics(judged, metrics, prefix="rule")
        metrics["judge_status"] = _shares([v.status for v in verdicts])
    metrics["grading_status"] = _shares(statuses)

    if data.output_path is not None:
        output_path = os.path.expanduser(data.output_path)
        os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
        source = os.path.expanduser(data.path)
        table = pq.read_table(source) if source.endswith(".parquet") else pa.Table.from_pylist(rows)
        table = table.drop_columns([name for name in columns if name in table.column_names])
        for name, values in columns.items():
            grouped = [values[i * n_samples : (i + 1) * n_samples] for i in range(len(rows))]
            table = table.append_column(name, pa.array(grouped, type=pa.list_(pa.float64())))
        pq.write_table(table, output_path)
    os.makedirs(os.path.dirname(os.path.abspath(where)), exist_ok=True)
    with open(where, "w") as f:
        json.dump(metrics, f, indent=2)
    per_source = {k: v for k, v in metrics.items() if k not in STATUS_TABLES}
    markdown = os.path.splitext(where)[0] + ".md"
    with open(markdown, "w") as f:
        f.write(format_metrics_table(per_source, markdown=True) + "\n")

    print(f"\n{data.path}: {len(rows)} prompts x {n_samples} responses")
    print(format_metrics_table(per_source))
    for name in STATUS_TABLES:
        if name in metrics:
            print(name.replace("_", " ") + ": " + ", ".join(f"{s} {share:.1%}" for s, share in metrics[name].items()))
    print(f"wrote {where}, {markdown}" + (f" and {data.output_path}" if data.output_path else ""))
    return metrics


def _shares(statuses: list[str]) -> dict[str, float]:
    counts = Counter(statuses)
    return {status: counts[status] / len(statuses) for status in sorted(counts)}


def main(argv: list[str] | None = None) -> int:
    try:
        return run_cli("evaluation", run_eval, argv)
    except EndpointError as err:  # the judge's server failed after its retries; the message names URL and fix
        print(f"Judge error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
