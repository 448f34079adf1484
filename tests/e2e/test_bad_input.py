"""The bad-input catalogue (docs/reliability.md): each case stops `python -m verl.trainer.main_ppo` before Ray starts
with exit code 2 and one paragraph naming the file, row, column or directory and the fix, and no traceback.

The cases run in-process through `main(argv)` (a subprocess pays the imports, seconds each) with `init_ray` replaced
by a trap, so a case that got as far as starting Ray fails; one case runs as a real subprocess to check the exit code
and the absence of a traceback, and HYDRA_FULL_ERROR=1 brings the traceback back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pyarrow.parquet as pq
import pytest

from verl.trainer import main_ppo
from verl.utils.config import ConfigError

pytestmark = pytest.mark.e2e

GOOD_TOOL = "verl.workers.tools.python_tool.PythonTool"


def read_only_dir(root) -> str | None:
    """A directory this process cannot create files in: a mode 555 directory, or (as root, who ignores modes) a
    read-only file system's; None when there is none to be had."""
    candidates = [str(root / "read_only")]
    os.makedirs(candidates[0])
    os.chmod(candidates[0], 0o555)
    candidates.append("/sys")
    for path in candidates:
        try:
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError:
            return path
    return None


@pytest.fixture(scope="module")
def bad(tiny_model_dir, arithmetic_data_dir, tmp_path_factory):
    """The broken inputs of the catalogue, built from the tiny model and the arithmetic task."""
    root = tmp_path_factory.mktemp("bad_input")
    os.makedirs(root / "empty_model")
    for name in ("corrupt_config", "no_template"):
        shutil.copytree(tiny_model_dir, root / name)
    config_text = (root / "corrupt_config" / "config.json").read_text()
    (root / "corrupt_config" / "config.json").write_text(config_text[: len(config_text) // 2])
    os.remove(root / "no_template" / "chat_template.jinja")
    table = pq.read_table(os.path.join(arithmetic_data_dir, "train.parquet"))
    pq.write_table(table.slice(0, 0), root / "empty.parquet")
    (root / "truncated.parquet").write_bytes((root / "empty.parquet").read_bytes()[:20])
    lines = [json.dumps(row) for row in table.slice(0, 8).to_pylist()]
    lines[4] = lines[4][:40]  # line 5 cut short
    (root / "corrupt.jsonl").write_text("\n".join(lines) + "\n")
    (root / "tools.yaml").write_text(f"tool_instances:\n  python:\n    class_path: {GOOD_TOOL[:-1]}\n")
    return {"root": root, "model": tiny_model_dir, "data": arithmetic_data_dir, "read_only": read_only_dir(root)}


def argv(bad, run_dir, model=None, train=None, *extra):
    return [
        f"actor_rollout_ref.model.path={model or bad['model']}",
        f"data.train_files={train or os.path.join(bad['data'], 'train.parquet')}",
        f"data.val_files={os.path.join(bad['data'], 'test.parquet')}",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "trainer.device=cpu",
        "trainer.total_training_steps=1",
        f"trainer.default_local_dir={run_dir}",
        *extra,
    ]


# name -> (argv of the case: (bad inputs, run dir) -> list, what the message must say (formatted with the inputs))
CASES = {
    "empty model directory": (
        lambda b, d: argv(b, d, model=b["root"] / "empty_model"),
        [
            "actor_rollout_ref.model.path={root}/empty_model is empty: it is not a Hugging Face model directory",
            "Point it at such a directory",
        ],
    ),
    "empty parquet": (
        lambda b, d: argv(b, d, train=b["root"] / "empty.parquet"),
        ["{root}/empty.parquet holds no rows", "point data.train_files / data.val_files at the right file"],
    ),
    "truncated parquet": (
        lambda b, d: argv(b, d, train=b["root"] / "truncated.parquet"),
        ["{root}/truncated.parquet: not a readable parquet file", "write it again"],
    ),
    "corrupt JSONL line": (
        lambda b, d: argv(b, d, train=b["root"] / "corrupt.jsonl"),
        ["{root}/corrupt.jsonl, line 5: not valid JSON", "fix or delete that line"],
    ),
    "corrupt config.json": (
        lambda b, d: argv(b, d, model=b["root"] / "corrupt_config"),
        [
            "{root}/corrupt_config/config.json is not valid JSON (",
            "actor_rollout_ref.model.path",
            "Download or copy the model again",
        ],
    ),
    "missing chat template": (
        lambda b, d: argv(b, d, model=b["root"] / "no_template"),
        [
            "the tokenizer at {root}/no_template (actor_rollout_ref.model.path) has no chat template",
            "add a chat_template.jinja to {root}/no_template",
        ],
    ),
    "missing prompt column": (
        lambda b, d: argv(b, d, None, None, "data.prompt_key=question"),
        [
            "train.parquet, row 0: no 'question' column (columns present: ['ability', 'data_source', 'extra_info', "
            "'prompt', 'reward_model'])",
            "set data.prompt_key",
        ],
    ),
    "train batch larger than the data": (
        lambda b, d: argv(b, d, None, None, "data.train_batch_size=1000"),
        ["data.train_files hold 256 prompts, fewer than data.train_batch_size=1000", "lower data.train_batch_size"],
    ),
    "read-only output directory": (
        lambda b, d: argv(b, os.path.join(b["read_only"], "run")),
        ["trainer.default_local_dir={read_only}/run cannot be written", "choose a directory"],
    ),
    "read-only rollout dump directory": (
        lambda b, d: argv(b, d, None, None, f"trainer.rollout_data_dir={b['read_only']}/dumps"),
        ["trainer.rollout_data_dir={read_only}/dumps cannot be written", "Choose a directory"],
    ),
    "mistyped tool class_path": (
        lambda b, d: argv(
            b,
            d,
            None,
            None,
            "actor_rollout_ref.rollout.mode=sync_with_tool",
            f"actor_rollout_ref.rollout.tools.config_path={b['root'] / 'tools.yaml'}",
        ),
        [
            f"actor_rollout_ref.rollout.tools.tool_instances.python.class_path={GOOD_TOOL[:-1]}: the tool could not be "
            "loaded: ImportError",
            "or set actor_rollout_ref.rollout.tools.fail_on_error=false",
        ],
    ),
    "missing tool config file": (
        lambda b, d: argv(
            b,
            d,
            None,
            None,
            "actor_rollout_ref.rollout.mode=sync_with_tool",
            f"actor_rollout_ref.rollout.tools.config_path={b['root'] / 'no_tools.yaml'}",
        ),
        ["actor_rollout_ref.rollout.tools.config_path={root}/no_tools.yaml: cannot read it"],
    ),
}


@pytest.fixture
def no_ray(monkeypatch):
    def init_ray(*args, **kwargs):
        raise AssertionError("Ray was started: the input check must stop the run before")

    monkeypatch.setattr(main_ppo, "init_ray", init_ray)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_paragraph_and_exit_code_2_before_ray(case, bad, tmp_path, no_ray, capsys):
    if "read-only" in case and bad["read_only"] is None:
        pytest.skip("no read-only directory on this machine")
    make_argv, expected = CASES[case]
    assert main_ppo.main([str(arg) for arg in make_argv(bad, tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Config error: ") and "\n\n" not in err and "Traceback" not in err, err  # one paragraph
    for fragment in expected:
        assert fragment.format(**bad) in err, err


def test_a_subprocess_exits_2_without_traceback_and_hydra_full_error_shows_it(bad, tmp_path, no_ray, monkeypatch):
    args = [str(arg) for arg in argv(bad, tmp_path / "run", None, bad["root"] / "corrupt.jsonl")]
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    run = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    assert run.stderr.splitlines()[-1].startswith(f"Config error: {bad['root']}/corrupt.jsonl, line 5: not valid JSON")

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigError, match="corrupt.jsonl, line 5"):
        main_ppo.main(args)
