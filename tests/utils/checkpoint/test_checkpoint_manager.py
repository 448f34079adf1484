import os
import signal
import subprocess
import sys
import textwrap

import pytest

from verl.utils.checkpoint.checkpoint_manager import (
    LATEST_FILE,
    atomic_step_dir,
    find_latest_ckpt_path,
    remove_old_checkpoints,
    step_dirs,
)


def _save(root, step, content="ok"):
    with atomic_step_dir(str(root), step) as tmp:
        os.makedirs(os.path.join(tmp, "actor"))
        with open(os.path.join(tmp, "actor", "shard.pt"), "w") as f:
            f.write(content)


def test_save_publishes_dir_and_latest(tmp_path):
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    assert (tmp_path / LATEST_FILE).read_text() == "4"
    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_4")
    assert [step for step, _ in step_dirs(str(tmp_path))] == [2, 4]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".tmp")]


def test_exception_inside_save_leaves_nothing(tmp_path):
    _save(tmp_path, 1)
    with pytest.raises(RuntimeError):
        with atomic_step_dir(str(tmp_path), 2) as tmp:
            open(os.path.join(tmp, "half"), "w").close()
            raise RuntimeError("disk full")
    assert sorted(os.listdir(tmp_path)) == ["global_step_1", LATEST_FILE]
    assert find_latest_ckpt_path(str(tmp_path)).endswith("global_step_1")


def test_sigkill_during_save_keeps_previous_checkpoint(tmp_path):
    _save(tmp_path, 3)
    script = textwrap.dedent(f"""
        import os, signal
        from verl.utils.checkpoint.checkpoint_manager import atomic_step_dir
        with atomic_step_dir({str(tmp_path)!r}, 6) as tmp:
            open(os.path.join(tmp, "model_world_size_2_rank_0.pt"), "w").write("partial")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert result.returncode == -signal.SIGKILL
    leftovers = [name for name in os.listdir(tmp_path) if name.startswith(".tmp-global_step_6")]
    assert leftovers  # the killed save left its temporary dir behind ...
    assert find_latest_ckpt_path(str(tmp_path)).endswith("global_step_3")  # ... which resume ignores
    _save(tmp_path, 7)  # the next save clears the leftovers
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".tmp")]


def test_resaving_a_step_replaces_it(tmp_path):
    _save(tmp_path, 5, "old")
    _save(tmp_path, 5, "new")
    assert (tmp_path / "global_step_5" / "actor" / "shard.pt").read_text() == "new"


def test_latest_marker_pointing_nowhere_falls_back_to_scan(tmp_path, capsys):
    _save(tmp_path, 2)
    (tmp_path / LATEST_FILE).write_text("9")
    assert find_latest_ckpt_path(str(tmp_path)).endswith("global_step_2")
    assert "scanning" in capsys.readouterr().out
    assert find_latest_ckpt_path(str(tmp_path / "missing")) is None


def test_retention_keeps_newest(tmp_path):
    for step in (1, 2, 3, 10):
        _save(tmp_path, step)
    removed = remove_old_checkpoints(str(tmp_path), keep=2)
    assert [os.path.basename(p) for p in removed] == ["global_step_1", "global_step_2"]
    assert [step for step, _ in step_dirs(str(tmp_path))] == [3, 10]
    assert remove_old_checkpoints(str(tmp_path), keep=None) == []
