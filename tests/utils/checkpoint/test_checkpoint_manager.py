import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from verl.utils.checkpoint.checkpoint_manager import (
    LATEST_FILE,
    MANIFEST_FILE,
    CheckpointError,
    atomic_step_dir,
    checkpoint_problems,
    checkpoint_step,
    find_latest_ckpt_path,
    remove_old_checkpoints,
    select_resume_checkpoint,
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


def test_retention_leaves_checkpoints_newer_than_the_current_step(tmp_path):
    # A run that fell back from a damaged global_step_5 to 2 and has now saved step 3.
    for step in (1, 2, 3, 5):
        _save(tmp_path, step)
    removed = remove_old_checkpoints(str(tmp_path), keep=1, current_step=3)
    assert [os.path.basename(p) for p in removed] == ["global_step_1", "global_step_2"]
    assert [step for step, _ in step_dirs(str(tmp_path))] == [3, 5]


# ----------------------------------------------------------------------------------------------- manifests
SHARD = "model_world_size_2_rank_1.pt"


def _save_run(root, step, world_size=2):
    """A step directory shaped like the trainer's: data.pt, actor/fsdp_config.json and two ranks' files."""
    with atomic_step_dir(str(root), step) as tmp:
        os.makedirs(os.path.join(tmp, "actor"))
        with open(os.path.join(tmp, "data.pt"), "wb") as f:
            f.write(b"driver state")
        with open(os.path.join(tmp, "actor", "fsdp_config.json"), "w") as f:
            json.dump({"world_size": world_size}, f)
        for rank in range(world_size):
            for kind in ("model", "optim", "extra_state"):
                with open(os.path.join(tmp, "actor", f"{kind}_world_size_{world_size}_rank_{rank}.pt"), "wb") as f:
                    f.write(f"{kind} {rank} of step {step}".encode() * 10)
    return root / f"global_step_{step}"


def test_the_manifest_lists_every_file_with_its_size_and_sha256(tmp_path):
    step_dir = _save_run(tmp_path, 4)
    manifest = json.loads((step_dir / MANIFEST_FILE).read_text())
    assert manifest["step"] == 4 and manifest["world_size"] == 2
    assert manifest["files"]["data.pt"] == {"size": 12, "sha256": hashlib.sha256(b"driver state").hexdigest()}
    assert manifest["files"][f"actor/{SHARD}"]["size"] == len("model 1 of step 4") * 10
    assert len(manifest["files"]) == 8  # data.pt, fsdp_config.json, 3 kinds x 2 ranks; not the manifest itself
    assert checkpoint_problems(str(step_dir)) == ([], True)


def test_every_kind_of_damage_is_named_file_by_file(tmp_path):
    step_dir = _save_run(tmp_path, 4)
    saved = os.path.getsize(step_dir / "actor" / SHARD)
    with open(step_dir / "actor" / SHARD, "r+b") as f:
        f.truncate(100)
    open(step_dir / "actor" / "optim_world_size_2_rank_0.pt", "wb").close()
    os.remove(step_dir / "actor" / "extra_state_world_size_2_rank_1.pt")
    (step_dir / "data.pt").write_bytes(b"DRIVER STATE")  # same size, other bytes
    problems, verified = checkpoint_problems(str(step_dir))
    assert verified
    assert problems == [
        "actor/extra_state_world_size_2_rank_1.pt: missing",
        f"actor/{SHARD}: 100 bytes, saved with {saved} (truncated)",
        "actor/optim_world_size_2_rank_0.pt: 0 bytes, saved with 170 (empty)",
        "data.pt: contents changed since the save (SHA-256 differs, same size)",
    ]
    assert checkpoint_problems(str(step_dir), under="actor")[0] == problems[:3]  # what the merger checks


def test_auto_falls_back_past_a_damaged_newest_checkpoint_with_one_warning(tmp_path, capsys):
    for step in (1, 2, 3):
        _save_run(tmp_path, step)
    os.remove(tmp_path / "global_step_3" / "actor" / SHARD)
    open(tmp_path / "global_step_2" / "data.pt", "wb").close()
    chosen = select_resume_checkpoint(str(tmp_path), "auto", None, ["actor"])
    assert chosen == str(tmp_path / "global_step_1")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[checkpoint] WARNING: 2 newer checkpoint(s) damaged, resuming from")
    assert f"global_step_3: actor/{SHARD}: missing" in err[0] and "global_step_2: data.pt: 0 bytes" in err[0]


def test_auto_starts_from_the_step_the_latest_marker_names(tmp_path, capsys):
    for step in (1, 2, 3):
        _save_run(tmp_path, step)
    (tmp_path / LATEST_FILE).write_text("2")  # a run that resumed from 2 and has not saved 3 again yet
    assert select_resume_checkpoint(str(tmp_path), "auto", None, ["actor"]) == str(tmp_path / "global_step_2")
    assert select_resume_checkpoint(str(tmp_path / "empty"), "auto", None, ["actor"]) is None
    assert select_resume_checkpoint(str(tmp_path), "disable", None, ["actor"]) is None
    assert capsys.readouterr().err == ""


def test_no_intact_checkpoint_or_a_damaged_resume_path_is_an_error_naming_the_files(tmp_path):
    step_dir = _save_run(tmp_path, 1)
    open(step_dir / "actor" / SHARD, "wb").close()
    with pytest.raises(CheckpointError, match=f"every checkpoint in .* is damaged: .*actor/{SHARD}: 0 bytes"):
        select_resume_checkpoint(str(tmp_path), "auto", None, ["actor"])
    with pytest.raises(CheckpointError, match=f"trainer.resume_from_path=.* cannot be resumed from: .*{SHARD}"):
        select_resume_checkpoint(str(tmp_path), "resume_path", str(step_dir), ["actor"])
    # A critic run cannot resume from an actor-only checkpoint either.
    intact = _save_run(tmp_path, 2)
    with pytest.raises(CheckpointError, match="critic/fsdp_config.json: missing"):
        select_resume_checkpoint(str(tmp_path), "resume_path", str(intact), ["actor", "critic"])


def test_a_checkpoint_without_manifest_loads_unverified_unless_a_rank_file_is_empty(tmp_path, capsys):
    step_dir = _save_run(tmp_path, 1)
    os.remove(step_dir / MANIFEST_FILE)  # as saved before manifests existed
    assert select_resume_checkpoint(str(tmp_path), "auto", None, ["actor"]) == str(step_dir)
    assert "has no manifest.json (saved before Quiver wrote manifests)" in capsys.readouterr().out
    open(step_dir / "actor" / "optim_world_size_2_rank_0.pt", "wb").close()
    assert checkpoint_problems(str(step_dir)) == (["actor/optim_world_size_2_rank_0.pt: empty"], False)


def test_a_damaged_manifest_damages_its_checkpoint(tmp_path):
    _save_run(tmp_path, 1)
    step_dir = _save_run(tmp_path, 2)
    (step_dir / MANIFEST_FILE).write_text('{"format": "quiver-checkpoint-manifest-v1", "files": ')
    problems, _ = checkpoint_problems(str(step_dir))
    assert problems == ["manifest.json: Expecting value: line 1 column 54 (char 53), so no file can be verified"]
    assert select_resume_checkpoint(str(tmp_path), "auto", None, ["actor"]) == str(tmp_path / "global_step_1")


def test_a_checkpoints_step_comes_from_its_manifest_or_from_the_driver_state(tmp_path):
    import torch

    _save(tmp_path, 7)
    assert checkpoint_step(str(tmp_path / "global_step_7")) == 7
    old = tmp_path / "renamed_by_hand"  # a checkpoint of before manifests, moved: its name says nothing
    old.mkdir()
    torch.save({"global_steps": 12}, old / "data.pt")
    assert checkpoint_step(str(old)) == 12
