"""The FSDP model merger: shard a real HF model the way the checkpoint layout describes, merge it, compare."""

from __future__ import annotations

import functools
import json
import os
import runpy
import shutil
import sys
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.model_merger.__main__ import main
from verl.model_merger.fsdp_model_merger import CheckpointError, merge_checkpoint, merge_shards, shard_file_name
from verl.utils.checkpoint.checkpoint_manager import write_manifest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INPUT_IDS = torch.tensor([[0, 5, 17, 42, 99, 3, 250, 7]])
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@functools.cache
def hf_state_dict(hf_dir):
    return AutoModelForCausalLM.from_pretrained(hf_dir).state_dict()  # with lm_head.weight, as model.state_dict() has


def write_checkpoint(
    hf_dir, actor_dir, world_size, *, drop=(), extra=None, replicate=("model.norm.weight",), state=None
):
    """The actor half of a checkpoint as the layout in docs/internal_contracts.md describes it (of the causal LM in
    `hf_dir`, or of `state`).

    Every tensor is split along dim 0 like FSDP2 does (torch.chunk, with empty shards for the ranks past the last
    chunk) except the `replicate` ones, which every rank holds in full.
    """
    state = {name: t for name, t in (state or hf_state_dict(hf_dir)).items() if name not in drop} | (extra or {})
    os.makedirs(os.path.join(actor_dir, "huggingface"))
    for rank in range(world_size):
        tensors = {}
        for name, t in state.items():
            if name in replicate:
                tensors[name] = t.clone()
            else:
                chunks = list(torch.chunk(t, world_size, dim=0))
                chunks += [t.new_empty((0, *t.shape[1:]))] * (world_size - len(chunks))
                tensors[name] = chunks[rank].clone()
        torch.save(
            {
                "tensors": tensors,
                "placements": {n: ["replicate"] if n in replicate else ["shard", 0] for n in state},
                "global_shapes": {n: list(t.shape) for n, t in state.items()},
                "dtype": "float32",
            },
            os.path.join(actor_dir, shard_file_name(world_size, rank)),
        )
    with open(os.path.join(actor_dir, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": world_size, "format": "quiver-local-shards-v1"}, f)
    for name in os.listdir(hf_dir):
        if name != "model.safetensors":
            shutil.copy(os.path.join(hf_dir, name), os.path.join(actor_dir, "huggingface", name))
    return actor_dir


@pytest.fixture
def run_dir(tmp_path, tiny_model_dir):
    """A run directory holding one complete world-size-2 checkpoint at global_step_5."""
    write_checkpoint(tiny_model_dir, str(tmp_path / "run" / "global_step_5" / "actor"), 2)
    (tmp_path / "run" / "latest_checkpointed_iteration.txt").write_text("5")
    return tmp_path / "run"


@pytest.mark.parametrize("world_size, drop", [(1, ()), (2, ("lm_head.weight",)), (3, ())])
def test_merge_round_trip(tmp_path, tiny_model_dir, reference, world_size, drop):
    # world size 3 splits 64 rows into 22 + 22 + 20; dropping the tied lm_head is how some savers write it
    actor = write_checkpoint(tiny_model_dir, str(tmp_path / "actor"), world_size, drop=drop)
    out = merge_checkpoint(actor, str(tmp_path / "merged"))

    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(INPUT_IDS).logits, reference(INPUT_IDS).logits, rtol=0, atol=1e-6)
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()
    text = "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n"
    assert (
        AutoTokenizer.from_pretrained(out)(text).input_ids
        == AutoTokenizer.from_pretrained(tiny_model_dir)(text).input_ids
    )
    assert merged.generation_config.eos_token_id == reference.generation_config.eos_token_id


def test_merge_shards_empty_last_rank_and_replicate():
    full = torch.arange(8.0).reshape(4, 2)
    shards = [
        {
            "tensors": {"w": piece, "b": torch.ones(3)},
            "placements": {"w": ["shard", 0], "b": ["replicate"]},
            "global_shapes": {"w": [4, 2], "b": [3]},
        }
        for piece in (full[:2], full[2:], full[:0])
    ]
    merged = merge_shards(shards)
    assert torch.equal(merged["w"], full) and torch.equal(merged["b"], torch.ones(3))


def test_dtype_option(run_dir, tmp_path):
    out = merge_checkpoint(str(run_dir / "global_step_5" / "actor"), str(tmp_path / "bf16"), dtype="bfloat16")
    assert AutoModelForCausalLM.from_pretrained(out, dtype="auto").dtype == torch.bfloat16
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["dtype"] == "bfloat16"


def test_checkpoint_without_fsdp_config_counts_shard_files(run_dir, tmp_path):
    actor = run_dir / "global_step_5" / "actor"
    os.remove(actor / "fsdp_config.json")
    with pytest.warns(UserWarning, match="inferred world_size=2"):
        merge_checkpoint(str(actor), str(tmp_path / "merged"))
    assert (tmp_path / "merged" / "model.safetensors").exists()


def _remove(*names):
    def edit(actor):
        for name in names:
            os.remove(os.path.join(actor, name))
        return actor

    return edit


def _wrong_shape(actor):
    path = os.path.join(actor, shard_file_name(2, 1))
    shard = torch.load(path, weights_only=True)
    shard["tensors"][Q_PROJ] = shard["tensors"][Q_PROJ][:-1]
    torch.save(shard, path)
    return actor


def _rebuild(**kwargs):
    def edit(actor):
        shutil.rmtree(actor)
        hf_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(actor))), "hf")
        return write_checkpoint(hf_dir, actor, 2, **kwargs)

    return edit


@pytest.mark.parametrize(
    "edit, expected",
    [
        (_remove("huggingface/config.json"), ["huggingface/config.json"]),
        (_remove(shard_file_name(2, 0), shard_file_name(2, 1), "fsdp_config.json"), ["model_world_size_*_rank_*.pt"]),
        (_remove(shard_file_name(2, 1)), [shard_file_name(2, 1), "global_step_5/actor"]),
        (_wrong_shape, [Q_PROJ, "[63, 64]", "[64, 64]"]),
        (lambda actor: os.path.dirname(actor), ["use --local_dir", "global_step_5/actor"]),
        (lambda actor: os.path.dirname(os.path.dirname(actor)), ["run directory", "run/global_step_5/actor"]),
        (lambda actor: actor + "_typo", ["does not exist"]),
        (_rebuild(drop=(Q_PROJ,)), ["missing keys", Q_PROJ]),
        (_rebuild(extra={"model.extra.weight": torch.zeros(2, 2)}), ["unexpected keys", "model.extra.weight"]),
    ],
    ids=[
        "no_hf_config",
        "no_shards",
        "rank_missing",
        "wrong_shape",
        "step_dir",
        "run_root",
        "no_dir",
        "missing_key",
        "unexpected_key",
    ],
)
def test_bad_checkpoint_errors_name_the_problem(run_dir, tmp_path, tiny_model_dir, edit, expected):
    shutil.copytree(tiny_model_dir, tmp_path / "hf")  # next to run/, for _rebuild
    local_dir = edit(str(run_dir / "global_step_5" / "actor"))
    with pytest.raises(CheckpointError) as info:
        merge_checkpoint(local_dir, str(tmp_path / "merged"))
    for text in expected:
        assert text in str(info.value)


def test_test_subcommand_passes_on_good_merge_and_fails_on_tampered(run_dir, tiny_model_dir, capsys):
    actor = str(run_dir / "global_step_5" / "actor")
    assert main(["test", "--backend", "fsdp", "--local_dir", actor, "--test_hf_dir", tiny_model_dir]) == 0
    assert f"{Q_PROJ}: max abs diff 0" in capsys.readouterr().out

    path = os.path.join(actor, shard_file_name(2, 1))
    shard = torch.load(path, weights_only=True)
    shard["tensors"][Q_PROJ][0, 0] += 0.5
    torch.save(shard, path)
    assert main(["test", "--local_dir", actor, "--test_hf_dir", tiny_model_dir]) == 1
    out = capsys.readouterr().out
    assert f"{Q_PROJ}: max abs diff 0.5" in out and "MISMATCH" in out


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--backend", "megatron"], "--backend megatron is not supported"),
        (["--hf_upload_path", "me/model"], "Hub"),
    ],
)
def test_unsupported_options(run_dir, tmp_path, capsys, args, expected):
    actor = str(run_dir / "global_step_5" / "actor")
    assert main(["merge", "--local_dir", actor, "--target_dir", str(tmp_path / "out"), *args]) == 1
    assert expected in capsys.readouterr().err


# runpy's note that this file imported the module (its `main`) before running it as __main__
@pytest.mark.filterwarnings("ignore:'verl.model_merger.__main__' found in sys.modules:RuntimeWarning")
def test_the_cli_module_merges(run_dir, tmp_path, monkeypatch):
    """`python -m verl.model_merger merge ...` as its module runs under `-m` (its `__main__` block and exit code), in
    this process: a new interpreter only re-imports torch and transformers. scripts/quickstart.sh runs this command
    as a real process (tests/e2e/test_quickstart.py::test_merged_model_loads)."""
    actor = str(run_dir / "global_step_5" / "actor")
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", actor,
                                      "--target_dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("verl.model_merger", run_name="__main__", alter_sys=True)
    assert exit_info.value.code == 0
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(tmp_path / "out"))


def test_a_critic_checkpoint_merges_into_a_token_classifier(tmp_path, tiny_model_dir):
    """A critic's shards (a value head on the actor's body) become a model AutoModelForTokenClassification loads,
    with the same values."""
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)
    value_model = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1).eval()
    value_model.save_pretrained(tmp_path / "value_model")
    critic = write_checkpoint(
        str(tmp_path / "value_model"), str(tmp_path / "critic"), 2, state=value_model.state_dict()
    )
    out = merge_checkpoint(critic, str(tmp_path / "merged"))
    merged = AutoModelForTokenClassification.from_pretrained(out).eval()
    assert type(merged).__name__ == "Qwen2ForTokenClassification" and merged.config.num_labels == 1
    with torch.no_grad():
        torch.testing.assert_close(merged(INPUT_IDS).logits, value_model(INPUT_IDS).logits, rtol=0, atol=0)
    assert main(["test", "--local_dir", critic, "--test_hf_dir", str(tmp_path / "value_model")]) == 0


@pytest.fixture
def verified_run_dir(run_dir):
    """run_dir's global_step_5 with the manifest the trainer writes last."""
    write_manifest(str(run_dir / "global_step_5"), 5)
    return run_dir


def test_a_checkpoint_with_its_manifest_merges_without_a_warning(verified_run_dir, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        merge_checkpoint(str(verified_run_dir / "global_step_5" / "actor"), str(tmp_path / "merged"))


def test_a_damaged_checkpoint_is_refused_naming_each_file(verified_run_dir, tmp_path, capsys):
    actor = verified_run_dir / "global_step_5" / "actor"
    shard = actor / shard_file_name(2, 1)
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:
        f.truncate(size - 1000)
    os.remove(actor / "huggingface" / "tokenizer.json")
    assert main(["merge", "--local_dir", str(actor), "--target_dir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "error: the checkpoint is damaged, refusing to merge it:" in err
    assert "actor/huggingface/tokenizer.json: missing" in err
    assert f"actor/{shard_file_name(2, 1)}: {size - 1000} bytes, saved with {size} (truncated)" in err
    assert not (tmp_path / "out").exists()
