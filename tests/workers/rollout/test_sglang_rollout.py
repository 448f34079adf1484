"""The SGLang engine against a stand-in for `sglang.srt.entrypoints.engine.Engine` (SGLang needs CUDA kernels; the
real engine is checked in tests/gpu/test_gpu_sglang.py): what it asks SGLang for, and how it reads the answers.

The stand-in continues a prompt with its last token + 1, + 2, ...; token t's text is "<t>", token 100 is EOS, and a
prompt holding token 0 is aborted. The sampled token's log-prob is log 1/2 at even steps, where it is also the top
token, and log 1/8 at odd ones, where it is not among the top ones; the top two are log 1/2 and log 1/4.
"""

import importlib
import importlib.machinery
import importlib.util
import math
import sys
import types

import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.config import load_config
from verl.workers.rollout import registry
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.registry import get_rollout_cls

EOS = 100
HALF, QUARTER, EIGHTH = math.log(0.5), math.log(0.25), math.log(0.125)
OK = (True, "Success")


class FakeEngine:
    """Records its constructor's kwargs and every call; answers `generate` in SGLang's output format."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []
        self.push_result = OK

    def generate(self, input_ids, sampling_params, return_logprob, top_logprobs_num):
        assert return_logprob
        self.calls.append(("generate", input_ids, sampling_params, top_logprobs_num))
        return [_answer(ids, sp, k) for ids, sp, k in zip(input_ids, sampling_params, top_logprobs_num)]

    def begin_weight_update(self):
        self.calls.append(("begin",))
        return OK

    def end_weight_update(self):
        self.calls.append(("end",))
        return OK

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        assert all(type(t) is torch.Tensor for _, t in named_tensors)  # gathered, no DTensor
        self.calls.append(("push", [name for name, _ in named_tensors], flush_cache))
        return self.push_result

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release", tags))

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume", tags))


def _answer(ids: list[int], sp: dict, k: int) -> dict:
    if 0 in ids:
        reason = {"type": "abort", "message": "scheduler out of memory", "status_code": None, "err_type": None}
        return {"output_ids": [], "meta_info": {"finish_reason": reason, "output_token_logprobs": []}}
    tokens, steps, tops, reason = [], [], [], None
    for t in range(sp["max_new_tokens"]):
        token = ids[-1] + 1 + t
        tokens.append(token)
        steps.append((HALF if t % 2 == 0 else EIGHTH, token, None))
        top = [(HALF, token if t % 2 == 0 else token + 1000, None), (QUARTER, token + 2000, None)]
        tops.append(top[:k])
        text = "".join(f"<{x}>" for x in tokens)
        matched = [s for s in sp["stop"] or () if s in text]
        if (token == EOS and not sp["ignore_eos"]) or token in (sp["stop_token_ids"] or ()):
            reason = {"type": "stop", "matched": token}
        elif matched:
            reason = {"type": "stop", "matched": matched[0]}
        if reason:
            break
    meta = {"finish_reason": reason or {"type": "length", "length": len(tokens)}, "output_token_logprobs": steps}
    if k:
        meta["output_top_logprobs"] = tops
    return {"text": "".join(f"<{x}>" for x in tokens), "output_ids": tokens, "meta_info": meta}


MODULE = "verl.workers.rollout.sglang_rollout"


@pytest.fixture
def sgl_alone(monkeypatch):
    """verl/workers/rollout/sglang_rollout.py, imported for this test only: its registration of "sglang" goes into
    a copy of the registry, so that the other tests of the session see the registry they would without this file."""
    monkeypatch.setattr(registry, "ROLLOUT_REGISTRY", dict(registry.ROLLOUT_REGISTRY))
    package = sys.modules["verl.workers.rollout"]
    before = sys.modules.pop(MODULE, None)
    yield importlib.import_module(MODULE)
    sys.modules.pop(MODULE, None)
    if before is None:
        delattr(package, "sglang_rollout")
    else:
        sys.modules[MODULE] = package.sglang_rollout = before


@pytest.fixture
def sgl(sgl_alone, monkeypatch):
    """The engine's module, with `sglang.srt.entrypoints.engine` a package path whose Engine is FakeEngine."""
    for name in ("sglang", "sglang.srt", "sglang.srt.entrypoints", "sglang.srt.entrypoints.engine"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["sglang.srt.entrypoints.engine"].Engine = FakeEngine
    return sgl_alone


def engine(sgl, engine_config_dir, device="cuda:0", **config):
    return sgl.SGLangRollout(engine_config_dir, OmegaConf.create(config), device=device)


def test_registered_as_sglang(sgl):
    assert get_rollout_cls("sglang") is sgl.SGLangRollout


def test_engine_arguments_from_the_rollout_config(sgl, engine_config_dir):
    rollout = sgl.SGLangRollout(engine_config_dir, OmegaConf.create({
        "gpu_memory_utilization": 0.3, "dtype": "float16", "prompt_length": 40, "response_length": 24,
        "engine_kwargs": {"sglang": {"disable_cuda_graph": True, "log_level": "warning"}},
    }), device="cuda:1", seed=7, load_format="dummy", tokenizer_path="/tok", hf_overrides={"rope_theta": 5.0})
    assert rollout.engine.kwargs == {
        "model_path": engine_config_dir, "tokenizer_path": "/tok", "trust_remote_code": False, "dtype": "float16",
        "load_format": "dummy", "random_seed": 7, "tp_size": 1, "mem_fraction_static": 0.3, "context_length": 64,
        "base_gpu_id": 1, "enable_memory_saver": True, "enable_weights_cpu_backup": True,
        "json_model_override_args": '{"rope_theta": 5.0}', "disable_cuda_graph": True, "log_level": "warning",
    }


def test_context_length_is_max_model_len_or_prompt_plus_response_within_the_models_positions(sgl, engine_config_dir):
    assert engine(sgl, engine_config_dir, max_model_len=80).engine.kwargs["context_length"] == 80
    assert engine(sgl, engine_config_dir, prompt_length=100, response_length=100).engine.kwargs["context_length"] == 128


@pytest.mark.parametrize("weights_follow", [True, False])
def test_build_loads_placeholders_only_when_weights_follow(sgl, engine_config_dir, weights_follow):
    rollout = sgl.SGLangRollout.build(model_path=engine_config_dir, tokenizer=None, config=OmegaConf.create({}), device="cuda:0",
                                  seed=None, load_module=None, weights_follow=weights_follow)
    kwargs = rollout.engine.kwargs
    assert kwargs["load_format"] == ("dummy" if weights_follow else "auto")  # the shipped load_format is dummy
    assert kwargs["tokenizer_path"] == engine_config_dir and kwargs["random_seed"] == 0
    assert kwargs.get("enable_weights_cpu_backup", False) is not weights_follow


def test_n_completions_per_prompt_in_order_with_surprisal_entropies(sgl, engine_config_dir):
    rollout = engine(sgl, engine_config_dir)
    out = rollout.generate([[5, 6], [20]], SamplingParams(n=2, max_tokens=3))
    (_, input_ids, sent, top_k), = rollout.engine.calls
    assert input_ids == [[5, 6], [5, 6], [20], [20]] and top_k == [0, 0, 0, 0]
    assert all(sp["n"] == 1 for sp in sent)
    assert [[c.token_ids for c in group] for group in out] == [[[7, 8, 9]] * 2, [[21, 22, 23]] * 2]
    first = out[0][0]
    assert first.log_probs == pytest.approx([HALF, EIGHTH, HALF])
    assert first.entropies == pytest.approx([math.log(2), math.log(8), math.log(2)])  # -log p of the sampled token
    assert (first.finish_reason, first.stop_reason, first.top_log_probs) == ("length", None, None)


def test_top_log_probs_give_the_top_k_entropy_estimate(sgl, engine_config_dir):
    rollout = engine(sgl, engine_config_dir)
    (completion,), = rollout.generate([[5]], SamplingParams(max_tokens=2, logprobs=2))
    assert rollout.engine.calls[0][3] == [2]
    # Step 0: the sampled token is the top one. Step 1: it is not, and comes last.
    assert completion.top_log_probs == [[HALF, QUARTER], [HALF, QUARTER, EIGHTH]]
    # -(1/2 ln 1/2 + 1/4 ln 1/4) = ln 2; plus -1/8 ln 1/8: (1/2 + 1/2 + 3/8) ln 2.
    assert completion.entropies == pytest.approx([math.log(2), 1.375 * math.log(2)])
    assert sgl._top_log_probs(None, 5, -1.5) == [-1.5]  # a position SGLang gave no top log-probs for


def test_finish_and_stop_reasons(sgl, engine_config_dir):
    rollout = engine(sgl, engine_config_dir)
    out = rollout.generate([[5], [5], [97], [5]], [
        SamplingParams(max_tokens=8, stop_token_ids=[8]),
        SamplingParams(max_tokens=8, stop=["<7>"], include_stop_str_in_output=True),
        SamplingParams(max_tokens=8),
        SamplingParams(max_tokens=2),
    ])
    got = [(c.token_ids, c.finish_reason, c.stop_reason) for (c,) in out]
    assert got == [([6, 7, 8], "stop", 8), ([6, 7], "stop", "<7>"), ([98, 99, 100], "stop", None),
                   ([6, 7], "length", None)]
    assert rollout.engine.calls[0][2][1]["no_stop_trim"] is True


def test_per_prompt_params_and_the_greedy_mapping(sgl, engine_config_dir):
    rollout = engine(sgl, engine_config_dir, ignore_eos=True)
    out = rollout.generate([[97], [97], [97], [97]], [
        SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=5),
        SamplingParams(max_tokens=2, temperature=0.0, top_p=0.5, top_k=5),
        SamplingParams(max_tokens=1, do_sample=False, temperature=0.7),
        SamplingParams(max_tokens=1, top_k=0),
    ])
    sent = rollout.engine.calls[0][2]
    assert [(sp["max_new_tokens"], sp["temperature"], sp["top_p"], sp["top_k"]) for sp in sent] == [
        (5, 0.7, 0.9, 5), (2, 0.0, 1.0, -1), (1, 0.0, 1.0, -1), (1, 1.0, 1.0, -1)]
    assert all(sp["ignore_eos"] for sp in sent)
    assert [c.token_ids for (c,) in out] == [[98, 99, 100, 101, 102], [98, 99], [98], [98]]  # EOS ignored


def test_an_aborted_request_raises(sgl, engine_config_dir):
    with pytest.raises(RuntimeError, match="finish_reason=.*abort.*scheduler out of memory"):
        engine(sgl, engine_config_dir).generate([[5], [0, 3]], SamplingParams(max_tokens=2))


def test_an_empty_prompt_is_refused(sgl, engine_config_dir):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine(sgl, engine_config_dir).generate([[5], []], SamplingParams())


class Sharded:
    """A DTensor's face: `full_tensor()` gathers it."""

    def __init__(self, full: torch.Tensor):
        self.full = full

    def full_tensor(self) -> torch.Tensor:
        return self.full


def test_update_weights_streams_every_tensor_in_buckets_and_sets_the_checksum(sgl, engine_config_dir, monkeypatch):
    monkeypatch.setattr(sgl, "BUCKET_BYTES", 16)
    rollout = engine(sgl, engine_config_dir, free_cache_engine=False)
    assert math.isnan(rollout.weights_checksum())
    tensors = (item for item in [("a", torch.ones(2)), ("b", Sharded(torch.full((3,), 2.0))), ("c", torch.ones(1))])
    rollout.update_weights(tensors)  # a one-pass generator
    # a (8 bytes), then b + c (12 + 4 = 16 bytes); the last bucket flushes the prefix cache.
    assert rollout.engine.calls == [("begin",), ("push", ["a"], False), ("push", ["b", "c"], True), ("end",)]
    assert rollout.weights_checksum() == 9.0


def test_a_failed_push_raises_and_closes_the_update_session(sgl, engine_config_dir):
    rollout = engine(sgl, engine_config_dir)
    rollout.engine.push_result = (False, "shape mismatch for lm_head.weight")
    with pytest.raises(RuntimeError, match="update_weights_from_tensor failed: shape mismatch"):
        rollout.update_weights([("lm_head.weight", torch.ones(2))])
    assert rollout.engine.calls[-1] == ("end",)


def test_sleep_releases_and_the_push_restores_the_weights_that_follow(sgl, engine_config_dir):
    rollout = sgl.SGLangRollout(engine_config_dir, OmegaConf.create({}), device="cuda:0", weights_follow=True)
    rollout.sleep()
    rollout.sleep()  # already asleep: nothing more
    assert rollout.weights_released
    with pytest.raises(RuntimeError, match="push them first"):
        rollout.generate([[5]], SamplingParams())
    rollout.update_weights([("a", torch.ones(2))])
    rollout.wake_up()
    rollout.wake_up()  # already awake: nothing more
    assert rollout.engine.calls == [
        ("release", ["weights", "kv_cache", "cuda_graph"]),
        ("resume", ["weights"]),  # the weights' memory first, then the push into it
        ("begin",), ("push", ["a"], False), ("end",),  # the released KV cache was flushed on release
        ("resume", ["kv_cache", "cuda_graph"]),
    ]
    assert not rollout.weights_released


def test_wake_up_restores_backed_up_weights_when_no_push_follows(sgl, engine_config_dir):
    rollout = engine(sgl, engine_config_dir)
    rollout.sleep()
    assert not rollout.weights_released
    rollout.wake_up()
    assert rollout.engine.calls == [("release", ["weights", "kv_cache", "cuda_graph"]),
                                    ("resume", ["weights", "kv_cache", "cuda_graph"])]


def test_without_free_cache_engine_sleep_keeps_everything(sgl, engine_config_dir):
    rollout = engine(sgl, engine_config_dir, free_cache_engine=False)
    rollout.sleep()
    rollout.wake_up()
    assert rollout.engine.calls == [] and rollout.engine.kwargs["enable_memory_saver"] is False


def test_cpu_and_tensor_parallelism_are_refused_before_sglang_is_imported(sgl_alone, engine_config_dir):
    sgl = sgl_alone
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.name=sglang runs on CUDA GPUs only.*name=hf "
                                         r"and .*name=vllm"):
        engine(sgl, engine_config_dir, device="cpu")
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2: .*one single-GPU engine on each rank.*"
                                         r"name=vllm"):
        engine(sgl, engine_config_dir, tensor_model_parallel_size=2)


def test_config_problems(sgl, monkeypatch):
    rollout = load_config().actor_rollout_ref.rollout
    assert sgl.config_problems(rollout, "cuda", 2, "rollout") == []
    rollout = load_config(overrides=["actor_rollout_ref.rollout.mode=sync_with_tool",
                                     "actor_rollout_ref.rollout.entropy_mode=exact",
                                     "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]).actor_rollout_ref.rollout
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)  # SGLang not installed
    problems = sgl.config_problems(rollout, "cpu", 2, "actor_rollout_ref.rollout")
    assert len(problems) == 4
    assert "name=sglang runs on CUDA GPUs only (device is cpu)" in problems[0]
    assert "tensor_model_parallel_size=2" in problems[1] and "(2 here)" in problems[1]
    assert "pip install sglang" in problems[2]
    assert "entropy_mode=exact" in problems[3]
