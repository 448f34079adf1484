"""benchmarks/grpo_step.py's report when a side did not finish: the GPU check gives the benchmark a fixed budget, so
a side cut short by it still yields a ratio from the timed steps both sides finished (the TRL side runs second)."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("grpo_step", ROOT / "benchmarks" / "grpo_step.py")
grpo_step = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grpo_step)


def _finished(median: float, steps: int) -> dict:
    return {"median_s": median, "s_per_step": median, "steps_timed": steps}


def test_a_side_interrupted_after_the_warm_up_gives_a_partial_ratio():
    results = {"quiver": _finished(2.0, 3),
               "trl": {"error": "interrupted (SIGINT) before it ended", "all_step_seconds": [30.0, 9.0, 11.0]}}
    assert grpo_step.partial_medians(results, warmup=1) == {"quiver": (2.0, 3), "trl": (10.0, 2)}
    # Only the warm-up step done, or no step: nothing to compare.
    results["trl"]["all_step_seconds"] = [30.0]
    assert grpo_step.partial_medians(results, warmup=1) is None
    assert grpo_step.partial_medians({"quiver": _finished(2.0, 3)}, warmup=1) is None


def test_the_written_report_and_the_printout_carry_the_partial_ratio(tmp_path, capsys):
    args = grpo_step.parse_args(["--out", str(tmp_path / "bench.json"), "--steps", "4"])
    results = {"quiver": {**_finished(2.0, 3), "ranks": 1, "min_s": 2.0, "max_s": 2.0, "mean_response_length": 8.0,
                          "phases_s": {"gen": 1.0}},
               "trl": {"error": "interrupted (SIGINT) before it ended", "all_step_seconds": [30.0, 9.0, 11.0]}}
    grpo_step.write_results(args, {}, results, "interrupted")
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["partial_ratio_trl_over_quiver_median"] == 5.0
    assert report["partial_steps_timed"] == {"quiver": 3, "trl": 2}
    assert "ratio_trl_over_quiver_median" not in report
    grpo_step.print_report(args, results)
    assert "partial ratio (TRL s/step / Quiver s/step): 5.00x" in capsys.readouterr().out


def test_waiting_for_gpu_memory_returns_at_once_without_a_gpu_reading(monkeypatch):
    monkeypatch.setattr(grpo_step, "gpu_memory_used_mib", lambda: None)
    grpo_step.wait_for_gpu_memory(1000.0, timeout_s=5)  # nvidia-smi gives no answer: nothing to wait for
    readings = iter([9000.0, 5000.0, 1500.0])
    monkeypatch.setattr(grpo_step, "gpu_memory_used_mib", lambda: next(readings))
    monkeypatch.setattr(grpo_step.time, "sleep", lambda s: None)
    grpo_step.wait_for_gpu_memory(1000.0, timeout_s=5)  # the previous side's worker lets go of its memory
    assert next(readings, None) is None
