"""The TensorRT-LLM engine against a stand-in for `tensorrt_llm` (TensorRT-LLM needs CUDA and NVIDIA's package index;
the real engine is checked in tests/gpu/test_gpu_trtllm.py): what it asks TensorRT-LLM for, and how it reads the
answers.

The stand-in continues a prompt with its last token + 1, + 2, ...; token 100 is EOS, the stop string "<t>" is token t
(TensorRT-LLM matches stop strings as token ids), and a prompt holding token 0 is cancelled. The sampled token's
log-prob is log 1/2 at even steps, where it is also the top token, and log 1/8 at odd ones, where it is not among the
top ones; the top two are log 1/2 and log 1/4. Its workers keep what `update_weights` hands them.
"""

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import math
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from test_sglang_rollout import Sharded

from verl.trainer.config import load_config
from verl.workers.rollout import registry
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.registry import get_rollout_cls

EOS = 100
HALF, QUARTER, EIGHTH = math.log(0.5), math.log(0.25), math.log(0.125)
UUID = "GPU-fake-uuid"


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclasses.dataclass(kw_only=True)
class FakeSamplingParams:
    """The fields of TensorRT-LLM's SamplingParams the engine sets."""

    n: int = 1
    max_tokens: int = 32
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list | None = None
    stop_token_ids: list | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    logprobs_mode: str = "raw"
    detokenize: bool = True


@dataclasses.dataclass
class KvCacheConfig:
    free_gpu_memory_fraction: float
    enable_block_reuse: bool


@dataclasses.dataclass
class RayPlacementConfig:
    placement_groups: list
    placement_bundle_indices: list
    per_worker_gpu_share: float


class SleepConfig:
    pass


class TorchLlmArgs:
    model_fields = {"enable_sleep": None}


class FakeWorker:
    """The engine's Ray worker with TensorRT-LLM's RL extension: opens the weight handles of its GPU."""

    def __init__(self):
        self.loaded: dict[str, torch.Tensor] = {}

    def update_weights(self, ipc_handles=None):
        if ipc_handles is None:
            return ["finalize"]
        opened = [(name, rebuild(*args)) for name, (rebuild, args) in ipc_handles[UUID]]
        self.loaded.update((name, tensor.clone()) for name, tensor in opened)
        return [name for name, _ in opened]


class FakeLLM:
    """Records its constructor's kwargs and every call; answers `generate` in TensorRT-LLM's output format."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []
        self.worker = FakeWorker()

    def generate(self, inputs, sampling_params, use_tqdm=True):
        self.calls.append(("generate", inputs, sampling_params))
        return [SimpleNamespace(outputs=[_answer(ids, sp)]) for ids, sp in zip(inputs, sampling_params)]

    def _collective_rpc(self, method, args=()):
        if method == "update_weights":
            self.calls.append((method, self.worker.update_weights(*args)))
        else:
            self.calls.append((method, *args))


def _answer(ids: list[int], sp: FakeSamplingParams) -> SimpleNamespace:
    if 0 in ids:
        return SimpleNamespace(token_ids=[], logprobs=[], finish_reason="cancelled", stop_reason=None)
    assert sp.logprobs >= 1  # the sampled token's log-prob is always asked for
    tokens, steps, reason, stop_reason = [], [], "length", None
    for t in range(sp.max_tokens):
        token = ids[-1] + 1 + t
        tokens.append(token)
        top = [(token if t % 2 == 0 else token + 1000, HALF), (token + 2000, QUARTER)][: sp.logprobs]
        step = {tok: Logprob(lp, rank) for rank, (tok, lp) in enumerate(top, start=1)}
        if token not in step:
            step[token] = Logprob(EIGHTH, 3000)
        steps.append(step)
        stops = [s for s in sp.stop or () if s == f"<{token}>"]
        if token in (sp.stop_token_ids or ()):
            reason, stop_reason = "stop", token
        elif stops:
            reason, stop_reason = "stop", stops[0]
        elif token == EOS and not sp.ignore_eos:
            reason = "stop"
        if reason == "stop":
            break
    return SimpleNamespace(token_ids=tokens, logprobs=steps, finish_reason=reason, stop_reason=stop_reason)


MODULE = "verl.workers.rollout.trtllm_rollout"


@pytest.fixture
def trt_alone(monkeypatch):
    """verl/workers/rollout/trtllm_rollout.py, imported for this test only: its registration of "trtllm" goes into a
    copy of the registry, so that the other tests of the session see the registry they would without this file."""
    importlib.import_module("verl.workers.rollout.vllm_rollout")  # imported by the engine: registers "vllm" for good
    # without "trtllm": an earlier test of the session (the memory estimate's) may have imported the engine already
    monkeypatch.setattr(registry, "ROLLOUT_REGISTRY", {k: v for k, v in registry.ROLLOUT_REGISTRY.items() if k != "trtllm"})
    package = sys.modules["verl.workers.rollout"]
    before = sys.modules.pop(MODULE, None)
    yield importlib.import_module(MODULE)
    sys.modules.pop(MODULE, None)
    if before is None:
        delattr(package, "trtllm_rollout")
    else:
        sys.modules[MODULE] = package.trtllm_rollout = before


@pytest.fixture
def trt(trt_alone, monkeypatch):
    """The engine's module, with `tensorrt_llm` a package whose LLM is FakeLLM; outside Ray (no placement)."""
    for name in ("tensorrt_llm", "tensorrt_llm.llmapi", "tensorrt_llm.llmapi.llm_args"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        monkeypatch.setitem(sys.modules, name, module)
    trtllm, llmapi, llm_args = (sys.modules[name] for name in ("tensorrt_llm", "tensorrt_llm.llmapi",
                                                               "tensorrt_llm.llmapi.llm_args"))
    trtllm.LLM, trtllm.SamplingParams, trtllm.llmapi = FakeLLM, FakeSamplingParams, llmapi
    llmapi.KvCacheConfig, llmapi.llm_args = KvCacheConfig, llm_args
    llm_args.TorchLlmArgs, llm_args.SleepConfig, llm_args.RayPlacementConfig = (TorchLlmArgs, SleepConfig,
                                                                                RayPlacementConfig)
    monkeypatch.setattr(trt_alone, "_device_uuid", lambda device: UUID)
    return trt_alone


def engine(trt, engine_config_dir, device="cuda:0", **config):
    return trt.TRTLLMRollout(engine_config_dir, OmegaConf.create(config), device=device)


def test_registered_as_trtllm(trt):
    assert get_rollout_cls("trtllm") is trt.TRTLLMRollout


def test_engine_arguments_from_the_rollout_config(trt, engine_config_dir):
    rollout = trt.TRTLLMRollout(engine_config_dir, OmegaConf.create({
        "gpu_memory_utilization": 0.3, "dtype": "float16", "prompt_length": 40, "response_length": 24,
        "max_num_seqs": 64, "max_num_batched_tokens": 4096, "enable_prefix_caching": False, "enforce_eager": False,
        "engine_kwargs": {"trtllm": {"attn_backend": "FLASHINFER"}},
    }), device="cuda:1", load_format="dummy", tokenizer_path="/tok")
    assert rollout.llm.kwargs == {
        "model": engine_config_dir, "tokenizer": "/tok", "trust_remote_code": False, "dtype": "float16",
        "tensor_parallel_size": 1, "load_format": "dummy", "max_seq_len": 64, "max_batch_size": 64,
        "max_num_tokens": 4096, "kv_cache_config": KvCacheConfig(0.3, False), "orchestrator_type": "ray",
        "ray_worker_extension_cls": "tensorrt_llm.llmapi.rlhf_utils.WorkerExtension", "enable_sleep": True,
        "attn_backend": "FLASHINFER",
    }


def test_shipped_defaults_run_eagerly_with_the_sleep_config_of_newer_releases(trt, engine_config_dir, monkeypatch):
    monkeypatch.setattr(TorchLlmArgs, "model_fields", {"sleep_config": None})
    kwargs = engine(trt, engine_config_dir, prompt_length=100, response_length=100).llm.kwargs
    assert kwargs["cuda_graph_config"] is None  # rollout.enforce_eager=true
    assert isinstance(kwargs["sleep_config"], SleepConfig) and "enable_sleep" not in kwargs
    assert kwargs["max_seq_len"] == 128  # prompt + response, within the model's positions
    assert kwargs["kv_cache_config"] == KvCacheConfig(0.5, True)


@pytest.mark.parametrize("weights_follow", [True, False])
def test_build_loads_placeholders_only_when_weights_follow(trt, engine_config_dir, weights_follow):
    rollout = trt.TRTLLMRollout.build(model_path=engine_config_dir, tokenizer=None, config=OmegaConf.create({}),
                                      device="cuda:0", seed=3, load_module=None, weights_follow=weights_follow)
    assert rollout.llm.kwargs["load_format"] == ("dummy" if weights_follow else "auto")  # the shipped one is dummy
    assert rollout.llm.kwargs["tokenizer"] == engine_config_dir


def test_inside_a_worker_group_the_engine_shares_the_ranks_bundle(trt, engine_config_dir, monkeypatch):
    import ray

    share = {"GPU": 0.5}
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray.util, "get_current_placement_group", lambda: "pg")
    monkeypatch.setattr(ray, "get_runtime_context",
                        lambda: SimpleNamespace(get_assigned_resources=lambda: share))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert engine(trt, engine_config_dir).llm.kwargs["ray_placement_config"] == RayPlacementConfig(["pg"], [[1]], 0.5)
    share["GPU"] = 1.0  # the worker holds the whole GPU: TensorRT-LLM's actor could not join it
    with pytest.raises(ValueError, match=r"holds 1 of its placement-group bundle's GPU.*one more process per rank "
                                         r"\(max_colocate_count\)"):
        engine(trt, engine_config_dir)


def test_n_completions_per_prompt_in_order_with_surprisal_entropies(trt, engine_config_dir):
    rollout = engine(trt, engine_config_dir)
    out = rollout.generate([[5, 6], [20]], SamplingParams(n=2, max_tokens=3))
    (_, inputs, sent), = rollout.llm.calls
    assert inputs == [[5, 6], [5, 6], [20], [20]]
    assert all(sp.n == 1 and sp.logprobs == 1 and sp.include_stop_str_in_output and not sp.detokenize
               for sp in sent)
    assert [[c.token_ids for c in group] for group in out] == [[[7, 8, 9]] * 2, [[21, 22, 23]] * 2]
    first = out[0][0]
    assert first.log_probs == pytest.approx([HALF, EIGHTH, HALF])
    assert first.entropies == pytest.approx([math.log(2), math.log(8), math.log(2)])  # -log p of the sampled token
    assert (first.finish_reason, first.stop_reason, first.top_log_probs) == ("length", None, None)


def test_top_log_probs_give_the_top_k_entropy_estimate(trt, engine_config_dir):
    rollout = engine(trt, engine_config_dir)
    (completion,), = rollout.generate([[5]], SamplingParams(max_tokens=2, logprobs=2))
    assert rollout.llm.calls[0][2][0].logprobs == 2
    # Step 0: the sampled token is the top one. Step 1: it is not, and comes last.
    assert completion.top_log_probs == [[HALF, QUARTER], [HALF, QUARTER, EIGHTH]]
    # -(1/2 ln 1/2 + 1/4 ln 1/4) = ln 2; plus -1/8 ln 1/8: (1/2 + 1/2 + 3/8) ln 2.
    assert completion.entropies == pytest.approx([math.log(2), 1.375 * math.log(2)])


def test_finish_and_stop_reasons(trt, engine_config_dir):
    rollout = engine(trt, engine_config_dir)
    out = rollout.generate([[5], [5], [97], [5]], [
        SamplingParams(max_tokens=8, stop_token_ids=[8]),
        SamplingParams(max_tokens=8, stop=["<7>"]),
        SamplingParams(max_tokens=8),
        SamplingParams(max_tokens=2),
    ])
    got = [(c.token_ids, c.finish_reason, c.stop_reason) for (c,) in out]
    # The stop tokens stay in the ids (TensorRT-LLM would cut them off without include_stop_str_in_output).
    assert got == [([6, 7, 8], "stop", 8), ([6, 7], "stop", "<7>"), ([98, 99, 100], "stop", None),
                   ([6, 7], "length", None)]


def test_per_prompt_params_and_the_greedy_mapping(trt, engine_config_dir):
    rollout = engine(trt, engine_config_dir, ignore_eos=True)
    out = rollout.generate([[97], [97], [97], [97]], [
        SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=5),
        SamplingParams(max_tokens=2, temperature=0.0, top_p=0.5, top_k=5),
        SamplingParams(max_tokens=1, do_sample=False, temperature=0.7),
        SamplingParams(max_tokens=1, top_k=-1),
    ])
    sent = rollout.llm.calls[0][2]
    assert [(sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.logprobs_mode) for sp in sent] == [
        (5, 0.7, 0.9, 5, "processed"), (2, None, None, 1, "raw"), (1, None, None, 1, "raw"),
        (1, 1.0, 1.0, 0, "processed")]
    assert all(sp.ignore_eos for sp in sent)
    assert [c.token_ids for (c,) in out] == [[98, 99, 100, 101, 102], [98, 99], [98], [98]]  # EOS ignored


def test_a_cancelled_request_raises(trt, engine_config_dir):
    with pytest.raises(RuntimeError, match="finish_reason='cancelled'"):
        engine(trt, engine_config_dir).generate([[5], [0, 3]], SamplingParams(max_tokens=2))


def test_an_empty_prompt_is_refused(trt, engine_config_dir):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine(trt, engine_config_dir).generate([[5], []], SamplingParams())


def test_update_weights_reaches_the_workers_in_buckets_and_sets_the_checksum(trt, engine_config_dir, monkeypatch):
    monkeypatch.setattr(trt, "BUCKET_BYTES", 16)
    rollout = engine(trt, engine_config_dir)
    rollout.device = torch.device("cpu")  # no GPU here: the handles are those of host tensors
    assert math.isnan(rollout.weights_checksum())
    tensors = (item for item in [("a", torch.ones(2)), ("b", Sharded(torch.full((3,), 2.0))), ("c", torch.ones(1))])
    rollout.update_weights(tensors)  # a one-pass generator
    # a (8 bytes), then b + c (12 + 4 = 16 bytes); a call without handles finishes the update.
    assert rollout.llm.calls == [("update_weights", ["a"]), ("update_weights", ["b", "c"]),
                                 ("update_weights", ["finalize"])]
    loaded = rollout.llm.worker.loaded
    assert torch.equal(loaded["b"], torch.full((3,), 2.0))
    assert rollout.weights_checksum() == sum(float(t.sum()) for t in loaded.values()) == 9.0


def test_sleep_releases_the_kv_cache_and_wake_up_drops_the_prefix_cache(trt, engine_config_dir):
    rollout = engine(trt, engine_config_dir)
    rollout.sleep()
    rollout.sleep()  # already asleep: nothing more
    rollout.wake_up()
    rollout.wake_up()  # already awake: nothing more
    assert rollout.llm.calls == [("sleep", ["kv_cache"]), ("wakeup", ["kv_cache"]), ("reset_prefix_cache",)]


def test_without_free_cache_engine_sleep_keeps_everything(trt, engine_config_dir):
    rollout = engine(trt, engine_config_dir, free_cache_engine=False)
    rollout.sleep()
    rollout.wake_up()
    assert rollout.llm.calls == [] and "enable_sleep" not in rollout.llm.kwargs


def test_a_tensorrt_llm_without_logprobs_mode_is_refused(trt, engine_config_dir, monkeypatch):
    @dataclasses.dataclass(kw_only=True)
    class OldSamplingParams:
        logprobs: int | None = None

    monkeypatch.setattr(sys.modules["tensorrt_llm"], "SamplingParams", OldSamplingParams)
    with pytest.raises(ValueError, match="no SamplingParams.logprobs_mode"):
        engine(trt, engine_config_dir)


def test_cpu_tensor_parallelism_and_overrides_are_refused_before_tensorrt_llm_is_imported(trt_alone, engine_config_dir):
    trt = trt_alone
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.name=trtllm runs on CUDA GPUs only.*name=hf "
                                         r"and .*name=vllm"):
        engine(trt, engine_config_dir, device="cpu")
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2: .*one single-GPU engine on each rank.*"
                                         r"name=vllm"):
        engine(trt, engine_config_dir, tensor_model_parallel_size=2)
    with pytest.raises(ValueError, match=r"override_config=\{'rope_theta': 5.0\}: .*takes no config overrides"):
        trt.TRTLLMRollout(engine_config_dir, OmegaConf.create({}), device="cuda:0", hf_overrides={"rope_theta": 5.0})


def test_config_problems(trt, monkeypatch):
    rollout = load_config().actor_rollout_ref.rollout
    assert trt.config_problems(rollout, "cuda", 2, "rollout") == []
    overrides = [f"actor_rollout_ref.rollout.{key}" for key in ("mode=sync_with_tool", "entropy_mode=exact",
                                                                "tensor_model_parallel_size=2")]
    rollout = load_config(overrides=overrides).actor_rollout_ref.rollout
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)  # TensorRT-LLM not installed
    problems = trt.config_problems(rollout, "cpu", 2, "actor_rollout_ref.rollout")
    assert len(problems) == 4
    assert "name=trtllm runs on CUDA GPUs only (device is cpu)" in problems[0]
    assert "tensor_model_parallel_size=2" in problems[1] and "(2 here)" in problems[1]
    assert "pip install tensorrt_llm --extra-index-url https://pypi.nvidia.com" in problems[2]
    assert "entropy_mode=exact" in problems[3]


def test_the_run_plan_counts_the_engines_own_process_on_each_rank():
    """TensorRT-LLM's engine is a Ray actor of its own on the rank's GPU: one more process in the rank's bundle (the
    worker group's max_colocate_count, Ray's CPUs, the estimate's process memory)."""
    import dataclasses

    from verl.trainer.ppo.run_plan import plan_run

    plan = plan_run(load_config(overrides=["trainer.device=cpu"]), "cpu", actor_parameters=1000)
    assert plan.processes_per_rank == 1
    assert dataclasses.replace(plan, rollout=dataclasses.replace(plan.rollout, engine="trtllm")).processes_per_rank == 2
