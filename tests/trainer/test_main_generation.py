"""verl/trainer/main_generation.py on the tiny model: output file, metrics JSON, printed table, AvgN, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from verl.trainer.config import load_config
from verl.trainer.main_generation import (
    check_generation_config,
    infer_n_samples,
    main,
    metrics_path,
    run_generation,
)
from verl.utils.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FAST = ["rollout.response_length=12", "data.batch_size=3", "trainer.device=cpu"]


@pytest.fixture(scope="module")
def four_prompts(arithmetic_data_dir, tmp_path_factory):
    """The first 4 rows of the arithmetic test set, in a file whose name says Avg2."""
    path = tmp_path_factory.mktemp("gen_data") / "arith_Avg2.parquet"
    pd.read_parquet(Path(arithmetic_data_dir) / "test.parquet").head(4).to_parquet(path)
    return str(path)


def _config(model_dir, data_path, output_path, *overrides):
    return load_config("generation", [f"model.path={model_dir}", f"data.path={data_path}",
                                      f"data.output_path={output_path}", *FAST, *overrides])


@pytest.mark.parametrize("name, n", [("math500_Avg8.parquet", 8), ("aime_avg16_test.parquet", 16),
                                     ("AVG4.parquet", 4), ("math500.parquet", None), ("navg8.parquet", None)])
def test_infer_n_samples_from_file_name(name, n):
    assert infer_n_samples(f"/data/{name}") == n


def test_sampled_generation_infers_n_from_avg_token(tiny_model_dir, four_prompts, tmp_path, capsys):
    output = tmp_path / "out" / "gen.parquet"
    metrics = run_generation(_config(tiny_model_dir, four_prompts, output, "rollout.temperature=1.0"))

    result = pd.read_parquet(output)
    source = pd.read_parquet(four_prompts)
    assert list(result.columns) == [*source.columns, "responses", "scores"]
    assert len(result) == 4
    assert result["prompt"].map(lambda m: m[0]["content"]).tolist() == source["prompt"].map(
        lambda m: m[0]["content"]).tolist()
    assert all(len(r) == 2 and all(isinstance(t, str) for t in r) for r in result["responses"])
    assert all(len(s) == 2 for s in result["scores"])

    assert set(metrics) == {"arithmetic", "all"}
    assert set(metrics["all"]) == {"num_prompts", "avg@2", "mean@2", "pass@1", "pass@2"}
    assert metrics["all"]["num_prompts"] == 4
    all_scores = [s for row in result["scores"] for s in row]
    assert metrics["arithmetic"]["avg@2"] == pytest.approx(sum(all_scores) / 8)
    assert json.loads(Path(metrics_path(str(output))).read_text()) == metrics
    assert metrics_path(str(output)).endswith("out/gen.metrics.json")

    printed = capsys.readouterr().out
    assert "N=2" in printed  # the AvgN inference is announced
    header = next(line for line in printed.splitlines() if line.startswith("data_source"))
    assert header.split() == ["data_source", "num_prompts", "avg@2", "mean@2", "pass@1", "pass@2"]
    assert any(line.split()[:2] == ["arithmetic", "4"] for line in printed.splitlines())


def test_greedy_generation_with_custom_reward(tiny_model_dir, four_prompts, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("def parity(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 2)\n")
    output = tmp_path / "greedy.parquet"
    metrics = run_generation(_config(tiny_model_dir, four_prompts, output, "data.n_samples=1",
                                     "rollout.do_sample=false", f"custom_reward_function.path={reward}",
                                     "custom_reward_function.name=parity"))
    result = pd.read_parquet(output)
    assert all(len(r) == 1 for r in result["responses"])
    # Each score belongs to the response next to it.
    assert [s[0] for s in result["scores"]] == [float(len(r[0]) % 2) for r in result["responses"]]
    assert set(metrics["all"]) == {"num_prompts", "avg@1", "mean@1", "pass@1"}
    assert metrics["all"]["pass@1"] == pytest.approx(metrics["all"]["avg@1"])


def test_greedy_with_several_samples_is_an_error_naming_the_keys(tiny_model_dir, four_prompts, tmp_path):
    for overrides in (["data.n_samples=4", "rollout.do_sample=false"], ["rollout.temperature=0"]):
        config = _config(tiny_model_dir, four_prompts, tmp_path / "o.parquet", *overrides)
        with pytest.raises(ConfigError) as err:
            check_generation_config(config)
        assert "data.n_samples" in str(err.value) and "rollout.do_sample" in str(err.value)
    # The explicit key wins over the file name.
    assert check_generation_config(_config(tiny_model_dir, four_prompts, tmp_path / "o.parquet",
                                           "data.n_samples=1", "rollout.temperature=0")) == 1


def test_a_cuda_only_engine_off_cuda_is_an_error_naming_the_key(tiny_model_dir, four_prompts, tmp_path):
    """Generation runs the engine it is told to (no fallback): SGLang / TensorRT-LLM on a CPU run stop at the check,
    naming the key, the engines that run there and the missing package."""
    for name, package in (("sglang", "pip install sglang"), ("trtllm", "pip install tensorrt_llm")):
        config = _config(tiny_model_dir, four_prompts, tmp_path / "o.parquet", f"rollout.name={name}",
                         "trainer.device=cpu")
        with pytest.raises(ConfigError) as err:
            check_generation_config(config)
        message = str(err.value)
        assert f"rollout.name={name} runs on CUDA GPUs only (device is cpu)" in message and "rollout.name=hf" in message
        assert package in message


def test_bad_paths_name_their_keys(tiny_model_dir, four_prompts, tmp_path, capsys):
    code = main([f"model.path={tmp_path / 'no_model'}", f"data.path={tmp_path / 'missing.parquet'}",
                 "custom_reward_function.path=/nope/reward.py"])
    assert code == 2
    err = capsys.readouterr().err
    for key in ("model.path=", "data.path=", "data.output_path is not set", "custom_reward_function.path="):
        assert key in err
    assert main(["data.n_sample=2"]) == 2
    assert "data.n_samples" in capsys.readouterr().err  # the misspelled key gets a suggestion


def test_run_eval_script_usage():
    result = subprocess.run(["bash", str(ROOT / "scripts/eval/run_eval.sh")], capture_output=True, text=True)
    assert result.returncode == 2 and "usage" in result.stderr


def test_livecodebench_sample_is_generated_and_graded_in_parallel(tiny_model_dir, tmp_path):
    """The code path of offline evaluation: a .jsonl of LiveCodeBench rows, the pool manager grading in workers.
    The untrained tiny model writes no program, so every score is 0 (main_eval's tests grade known programs)."""
    output = tmp_path / "lcb.parquet"
    metrics = run_generation(_config(tiny_model_dir, ROOT / "data/livecodebench_sample.jsonl", output,
                                     "data.n_samples=2", "rollout.prompt_length=384", "reward_model.reward_manager=pool",
                                     "+reward_model.reward_kwargs.num_workers=2"))
    result = pd.read_parquet(output)
    assert len(result) == 6 and result["data_source"].unique().tolist() == ["livecodebench"]
    assert result["scores"].map(list).tolist() == [[0.0, 0.0]] * 6
    assert set(metrics["livecodebench"]) == {"num_prompts", "avg@2", "mean@2", "pass@1", "pass@2"}
    assert metrics["livecodebench"]["num_prompts"] == 6 and metrics["livecodebench"]["pass@2"] == 0.0


@pytest.mark.e2e
@pytest.mark.vllm
def test_vllm_engine_writes_the_hf_engines_greedy_responses(tiny_model_dir, four_prompts, tmp_path):
    """rollout.name=vllm (in a subprocess: vLLM joins torch.distributed and changes process-wide torch settings)."""
    greedy = ["data.n_samples=1", "rollout.do_sample=false"]
    run_generation(_config(tiny_model_dir, four_prompts, tmp_path / "hf.parquet", *greedy))
    cmd = [sys.executable, "-m", "verl.trainer.main_generation", f"model.path={tiny_model_dir}", f"data.path={four_prompts}",
           f"data.output_path={tmp_path / 'vllm.parquet'}", *FAST, *greedy, "rollout.name=vllm"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    hf, vllm = pd.read_parquet(tmp_path / "hf.parquet"), pd.read_parquet(tmp_path / "vllm.parquet")
    assert vllm["responses"].map(list).tolist() == hf["responses"].map(list).tolist()
    assert vllm["scores"].map(list).tolist() == hf["scores"].map(list).tolist()
