"""verl/utils/hdfs_io.py and verl/utils/fs.py: verl's file helpers on local paths; an hdfs:// path is an error saying
HDFS is not built."""

import os

import pytest

from verl.utils import fs, hdfs_io
from verl.utils.hdfs_io import HDFSNotAvailable


def test_makedirs_exists_and_copy_work_as_verls_data_scripts_call_them(tmp_path):
    local = tmp_path / "gsm8k"
    hdfs_io.makedirs(str(local))
    with pytest.raises(FileExistsError):
        hdfs_io.makedirs(str(local))  # os.makedirs' default, as in verl
    hdfs_io.makedirs(str(local), exist_ok=True)
    (local / "train.parquet").write_bytes(b"rows")
    (local / "sub").mkdir()
    (local / "sub" / "test.parquet").write_bytes(b"more")
    assert hdfs_io.exists(local / "train.parquet") and not hdfs_io.exists(tmp_path / "nope")

    shared = tmp_path / "shared" / "gsm8k"
    hdfs_io.makedirs(str(shared))  # the scripts make the destination first, then copy the folder into it
    assert hdfs_io.copy(src=str(local), dst=str(shared)) == str(shared)
    assert (shared / "train.parquet").read_bytes() == b"rows" and (shared / "sub" / "test.parquet").exists()
    assert hdfs_io.copy(str(local / "train.parquet"), str(tmp_path)) == str(tmp_path / "train.parquet")


@pytest.mark.parametrize("call", [
    lambda: hdfs_io.makedirs("hdfs://namenode/data/gsm8k"),
    lambda: hdfs_io.exists("hdfs://namenode/data/gsm8k"),
    lambda: hdfs_io.copy("/tmp/gsm8k", "hdfs://namenode/data/gsm8k"),
    lambda: fs.copy_to_local("hdfs://namenode/models/qwen"),
    lambda: fs.copy_local_path_from_hdfs("hdfs://namenode/models/qwen"),
], ids=["makedirs", "exists", "copy", "copy_to_local", "copy_local_path_from_hdfs"])
def test_an_hdfs_path_says_hdfs_is_not_built(call):
    with pytest.raises(HDFSNotAvailable, match=r"hdfs://namenode/.*: HDFS is not built in Quiver") as err:
        call()
    assert isinstance(err.value, OSError) and "--hdfs_dir" in str(err.value)


def test_copy_to_local_gives_a_local_path_or_a_model_id_back(tmp_path):
    assert fs.copy_to_local(str(tmp_path)) == str(tmp_path)
    assert fs.copy_to_local("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert fs.is_non_local("hdfs://x/y") and not fs.is_non_local(str(tmp_path))
    assert (fs.copy, fs.exists, fs.makedirs) == (hdfs_io.copy, hdfs_io.exists, hdfs_io.makedirs)


def test_copy_to_shm_copies_once(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "SHM_CACHE", str(tmp_path / "shm"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    copied = fs.copy_to_local(str(model), use_shm=True)
    assert copied.startswith(str(tmp_path / "shm")) and os.path.basename(copied) == "model"
    assert (tmp_path / "shm").joinpath(copied, "config.json").read_text() == "{}"
    (model / "config.json").write_text('{"changed": true}')
    assert fs.copy_to_shm(str(model)) == copied  # already there: not copied again
    assert [p.name for p in (tmp_path / "shm").rglob("*.partial-*")] == []


def test_local_mkdir_safe_makes_an_absolute_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert fs.local_mkdir_safe("ckpt/step_1") == str(tmp_path / "ckpt" / "step_1")
    assert fs.local_mkdir_safe("ckpt/step_1") == str(tmp_path / "ckpt" / "step_1")  # again: no error
