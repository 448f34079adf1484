"""A run owns its directory: the lock refuses a second live run and not a dead one; a start from scratch over an
earlier run's output is refused unless overwrite, which deletes only what a run writes."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from verl.utils.config import ConfigError
from verl.utils.run_dir import check_fresh_start, clear_run_outputs, own_run_dir

HOLD = textwrap.dedent("""
    import os, signal, sys, time
    from verl.utils.run_dir import own_run_dir
    with own_run_dir(sys.argv[1]):
        print("holding", flush=True)
        if sys.argv[2] == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)
""")


def _hold(path, then):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), then], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_a_second_run_is_refused_naming_the_first(tmp_path):
    holder = _hold(tmp_path, "sleep")
    try:
        with pytest.raises(ConfigError) as info:
            with own_run_dir(tmp_path):
                pass
        message = str(info.value)
        assert message.startswith(
            f"trainer.default_local_dir={tmp_path} is in use by another run: pid {holder.pid} "
            f"on {socket.gethostname()}, started 20"
        )
        assert "time.sleep(600)" not in message and "-c" in message  # the holder's command line
        assert "give this run its own directory" in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_a_killed_run_leaves_nothing_stuck(tmp_path, capsys):
    dead = _hold(tmp_path, "die")
    assert dead.wait() == -signal.SIGKILL
    assert json.loads((tmp_path / "run_owner.json").read_text())["pid"] == dead.pid  # left behind by the kill
    with own_run_dir(tmp_path):
        assert f"the previous run (pid {dead.pid} on " in capsys.readouterr().out
        owner = json.loads((tmp_path / "run_owner.json").read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert sorted(os.listdir(tmp_path)) == ["run.lock"]  # the owner file goes with a normal end


def _earlier_run(path, checkpoint=True):
    path.mkdir(exist_ok=True)
    (path / "metrics.jsonl").write_text('{"step": 1}\n')
    (path / "config.yaml").write_text("trainer: {}\n")
    if checkpoint:
        (path / "global_step_2" / "actor").mkdir(parents=True)
        (path / "latest_checkpointed_iteration.txt").write_text("2")


@pytest.mark.parametrize(
    "mode, checkpoint, overwrite, refused",
    [
        ("disable", True, False, "resume_mode=disable would start a new run"),
        ("disable", False, False, "resume_mode=disable would start a new run"),
        ("disable", True, True, None),
        ("auto", False, False, "holds the metrics of an earlier run but no checkpoint"),
        ("auto", True, False, None),
        ("resume_path", False, False, None),
    ],
)
def test_a_start_from_scratch_over_an_earlier_run_is_refused_unless_overwrite(
    tmp_path, mode, checkpoint, overwrite, refused
):
    assert check_fresh_start(str(tmp_path / "new"), mode, overwrite) is None  # an empty or new directory is fine
    _earlier_run(tmp_path, checkpoint)
    if refused is None:
        check_fresh_start(str(tmp_path), mode, overwrite)
    else:
        with pytest.raises(ConfigError, match=refused) as info:
            check_fresh_start(str(tmp_path), mode, overwrite)
        assert "trainer.overwrite=true" in str(info.value)


def test_overwrite_deletes_what_a_run_writes_and_nothing_else(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / ".tmp-global_step_3-77").mkdir()
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "run.lock").touch()
    removed = clear_run_outputs(str(tmp_path))
    assert removed == [
        ".tmp-global_step_3-77",
        "config.yaml",
        "global_step_2",
        "latest_checkpointed_iteration.txt",
        "metrics.jsonl",
        "tensorboard",
    ]
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "run.lock"]


def test_overwrite_without_resume_mode_disable_is_a_config_error():
    from verl.trainer.config import load_config
    from verl.trainer.ppo.config_rules import validate_ppo_config

    with pytest.raises(
        ConfigError, match=r"trainer.overwrite=true deletes .* needs trainer.resume_mode=disable \(here"
    ):
        validate_ppo_config(load_config(overrides=["trainer.overwrite=true"]))
    validate_ppo_config(load_config(overrides=["trainer.overwrite=true", "trainer.resume_mode=disable"]))
