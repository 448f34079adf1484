"""The run plan (verl/trainer/ppo/run_plan.py): what a run derives from its config, decided once. First which pass
gives the PPO ratio its old log-probs (algorithm.rollout_correction.bypass_mode), then the rest of the plan."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from verl.trainer.config import load_config
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.trainer.ppo.run_plan import SHARED_ENGINE_MIN_PARAMETERS, plan_run
from verl.utils.config import ConfigError
from verl.utils.run_plan import MicroBatches

BASE = ["data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]


def _source(*overrides, device="cpu"):
    return plan_run(load_config(overrides=[*BASE, *overrides]), device).old_log_prob_source


def test_auto_skips_the_pass_for_an_on_policy_update():
    assert _source() == "actor"
    assert _source("actor_rollout_ref.rollout.name=vllm") == "actor"  # whatever the engine


@pytest.mark.parametrize("override", ["actor_rollout_ref.actor.ppo_epochs=2",
                                      "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                      "algorithm.use_kl_in_reward=true"])
def test_auto_takes_the_hf_engines_exact_log_probs_when_off_policy(override):
    assert _source(override) == "rollout"


@pytest.mark.parametrize("overrides", [("actor_rollout_ref.rollout.name=vllm",),
                                       ("actor_rollout_ref.model.lora_rank=8",),
                                       ("actor_rollout_ref.rollout.mode=sync_with_tool",)])
def test_auto_recomputes_where_the_engine_is_not_exact(overrides):
    assert _source("actor_rollout_ref.actor.ppo_epochs=2", *overrides) == "recompute"
    assert _source("actor_rollout_ref.actor.ppo_epochs=2", *overrides, device="cuda") == "recompute"


def test_explicit_modes_win():
    assert _source("algorithm.rollout_correction.bypass_mode=false") == "recompute"
    assert _source("algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.actor.ppo_epochs=3") == "rollout"


def test_a_bad_mode_names_the_key():
    with pytest.raises(ConfigError, match="algorithm.rollout_correction.bypass_mode='sometimes'"):
        validate_ppo_config(load_config(overrides=[*BASE, "algorithm.rollout_correction.bypass_mode=sometimes"]))


@pytest.mark.parametrize("overrides", [("algorithm.rollout_correction.rollout_is=token",),
                                       ("algorithm.rollout_correction.rollout_rs=token_k1",
                                        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"),
                                       ("algorithm.adv_estimator=optimal_token_baseline",
                                        "actor_rollout_ref.actor.calculate_sum_pi_squared=true")])
def test_auto_recomputes_when_the_step_needs_the_actors_own_pass(overrides):
    """Rollout correction compares the actor's log-probs with the engine's; the optimal token baseline reads the
    actor's sum of squared probabilities. Both need the pass even where auto would skip it."""
    assert _source(*overrides) == "recompute"


# ------------------------------------------------------------------------------------------------ the rest of the plan
def _plan(*overrides, device="cpu", parameters=None):
    return plan_run(load_config(overrides=list(overrides)), device, parameters)


def test_per_rank_sizes_are_planned_and_the_config_keeps_the_users_meaning():
    overrides = ["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "trainer.nnodes=2",
                 "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
    config = load_config(overrides=overrides)
    before = OmegaConf.to_yaml(config)
    plan = plan_run(config, "cpu")
    assert (plan.n_ranks, plan.rollout.rows_per_rank) == (4, 8 * 4 // 4)
    assert plan.actor.update.mini_batch == 4 * 4 // 4  # prompts x n / ranks
    assert plan.actor.update.micro == MicroBatches(2, None, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
    assert plan.actor.forward.size is None  # unset: the memory estimate sizes it (main_ppo.plan_ppo_run)
    assert OmegaConf.to_yaml(config) == before  # nothing rewritten in place
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.n_ranks = 1


def test_deprecated_global_micro_batches_and_token_budgets():
    plan = _plan("trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size=8",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size=6")
    assert plan.actor.update.micro.size == 4 and plan.actor.forward.size == 3  # global / ranks
    dynamic = _plan("actor_rollout_ref.actor.use_dynamic_bsz=true",
                    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=3000")
    assert dynamic.actor.update.micro.dynamic and dynamic.actor.update.micro.max_token_len == 3000
    assert dynamic.actor.forward.max_token_len == 3000  # the YAML's interpolation: the rollout's follows the actor's
    assert dynamic.actor.update.micro.size is None


def test_which_passes_and_processes_run():
    grpo = _plan()
    assert (grpo.use_reference_policy, grpo.use_critic, grpo.use_reward_model, grpo.processes_per_rank) == (
        False, False, False, 1)
    ppo = _plan("algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true")
    assert (ppo.use_reference_policy, ppo.use_critic, ppo.processes_per_rank) == (True, True, 2)
    assert ppo.critic.update.mini_batch == ppo.actor.update.mini_batch
    assert ppo.critic.forward.key == "critic.forward_micro_batch_size_per_gpu"
    # A generative reward model is served to the reward function: no reward-model workers, no micro-batches.
    genrm = _plan("reward_model.enable=true", "reward_model.model.path=/judge", "reward_model.rollout.name=vllm")
    assert (genrm.use_reward_model, genrm.reward_model_server, genrm.reward_model.forward) == (False, "vllm", None)
    assert genrm.processes_per_rank == 1


def test_engine_dtypes_and_remove_padding_come_from_one_place():
    cpu, cuda = _plan(), _plan(device="cuda")
    assert (cpu.rollout.engine, cpu.actor.compute_dtype, cpu.actor.param_dtype) == ("hf", "float32", "float32")
    assert cuda.actor.compute_dtype == "bfloat16"  # fsdp_config.dtype's default, on CUDA only
    assert _plan("actor_rollout_ref.actor.fsdp_config.dtype=fp16", device="cuda").actor.compute_dtype == "float16"
    assert cpu.actor.remove_padding is True  # the YAML's default, not a constructor's
    assert _plan("actor_rollout_ref.model.use_remove_padding=false").actor.remove_padding is False
    # model_dtype: the parameters' dtype; on CPU also the compute dtype (no mixed precision there).
    bf16_ref = _plan("actor_rollout_ref.ref.fsdp_config.model_dtype=bf16", "actor_rollout_ref.actor.use_kl_loss=true")
    assert (bf16_ref.ref.param_dtype, bf16_ref.ref.compute_dtype, bf16_ref.actor.param_dtype) == (
        "bfloat16", "bfloat16", "float32")
    bf16_actor = _plan("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16", device="cuda")
    assert (bf16_actor.actor.param_dtype, bf16_actor.actor.compute_dtype, bf16_actor.ref.param_dtype) == (
        "bfloat16", "bfloat16", "float32")
    with pytest.raises(ConfigError, match="critic.model.fsdp_config.model_dtype='int8' must be one of"):
        validate_ppo_config(load_config(overrides=["critic.model.fsdp_config.model_dtype=int8"]))


def test_the_hf_engines_copy_is_float32_on_cpu_and_rollout_dtype_on_cuda():
    """On CPU the engine's log-probs may stand in for the actor's, so it keeps float32 whatever rollout.dtype says; on
    CUDA it decodes in rollout.dtype as vLLM does (bf16 by default), auto meaning the actor's compute dtype."""
    assert _plan().rollout.hf_engine_dtype == "float32"
    assert _plan("actor_rollout_ref.rollout.dtype=float16").rollout.hf_engine_dtype == "float32"
    assert _plan(device="cuda").rollout.hf_engine_dtype == "bfloat16"
    assert _plan("actor_rollout_ref.rollout.dtype=half", device="cuda").rollout.hf_engine_dtype == "float16"
    assert _plan("actor_rollout_ref.rollout.dtype=float32", device="cuda").rollout.hf_engine_dtype == "float32"
    auto = ["actor_rollout_ref.rollout.dtype=auto", "actor_rollout_ref.actor.fsdp_config.dtype=fp16"]
    assert _plan(*auto, device="cuda").rollout.hf_engine_dtype == "float16"
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.dtype=int8 is not a dtype the hf engine"):
        _plan("actor_rollout_ref.rollout.dtype=int8", device="cuda")


def test_hsdp_shard_groups_and_the_memory_levers_are_planned():
    two = ("trainer.n_gpus_per_node=2", "trainer.cpu_ranks_per_node=2")
    assert _plan(*two).actor.fsdp_size == 2  # -1: every rank in one shard group
    assert _plan(*two, "actor_rollout_ref.actor.fsdp_config.fsdp_size=1").actor.fsdp_size == 1
    assert _plan(*two, "critic.model.fsdp_config.fsdp_size=2").critic.fsdp_size == 2
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.fsdp_config.fsdp_size=3 must be -1 or divide"):
        _plan(*two, "actor_rollout_ref.actor.fsdp_config.fsdp_size=3")
    levers = _plan("actor_rollout_ref.model.use_fused_kernels=true", "actor_rollout_ref.actor.use_torch_compile=true",
                   "actor_rollout_ref.model.enable_activation_offload=true", device="cuda")
    assert (levers.actor.fused_logprobs, levers.actor.compile, levers.ref.compile, levers.actor.activation_offload) == (
        True, True, True, True)
    assert _plan("actor_rollout_ref.model.use_liger=true").actor.fused_logprobs  # the same path
    # On CPU the activations are in host memory already.
    assert not _plan("actor_rollout_ref.model.enable_activation_offload=true").actor.activation_offload
    assert "fused log-probs" in levers.describe()


def test_shared_cpu_engine():
    # Two ranks kept on the node (a large actor would otherwise run one rank with all the cores, nothing to share),
    # and the HF engine named (auto could take vLLM's CPU build for a large actor).
    two = ("trainer.n_gpus_per_node=2", "trainer.cpu_ranks_per_node=2", "actor_rollout_ref.rollout.name=hf")
    assert _plan(*two, parameters=SHARED_ENGINE_MIN_PARAMETERS).rollout.share_cpu_engine
    assert not _plan(*two, parameters=SHARED_ENGINE_MIN_PARAMETERS - 1).rollout.share_cpu_engine
    assert not _plan("trainer.n_gpus_per_node=1", parameters=SHARED_ENGINE_MIN_PARAMETERS).rollout.share_cpu_engine
    assert not _plan(*two, parameters=SHARED_ENGINE_MIN_PARAMETERS, device="cuda").rollout.share_cpu_engine
    assert _plan(*two, "actor_rollout_ref.rollout.share_cpu_engine=true").rollout.share_cpu_engine
    with pytest.raises(ConfigError, match="share_cpu_engine=true needs the hf engine on CPU"):
        _plan(*two, "actor_rollout_ref.rollout.share_cpu_engine=true", device="cuda")
    with pytest.raises(ConfigError, match="needs every rank on one node"):
        _plan(*two, "trainer.nnodes=2", "actor_rollout_ref.rollout.share_cpu_engine=true")


def test_a_large_actor_runs_one_rank_per_cpu_node_with_all_its_cores():
    large, small = SHARED_ENGINE_MIN_PARAMETERS, SHARED_ENGINE_MIN_PARAMETERS - 1
    two = ("trainer.n_gpus_per_node=2",)
    one = _plan(*two, parameters=large)
    assert (one.ranks_per_node, one.n_ranks, one.rollout.rows_per_rank) == (1, 1, 16 * 4)  # the YAML's batch on one rank
    assert not one.rollout.share_cpu_engine  # one rank: nothing to share
    assert _plan(*two, parameters=small).n_ranks == 2
    assert _plan(*two, device="cuda", parameters=large).n_ranks == 2  # GPUs: n_gpus_per_node
    assert _plan(*two, "trainer.nnodes=2", parameters=large).n_ranks == 4  # several nodes: n_gpus_per_node
    assert _plan(*two, "trainer.cpu_ranks_per_node=2", parameters=large).n_ranks == 2  # the user's number wins
    with pytest.raises(ConfigError, match="must be divisible by the 3 ranks of trainer.cpu_ranks_per_node=3"):
        _plan("data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "trainer.cpu_ranks_per_node=3")


@pytest.mark.vllm
def test_auto_takes_vllms_cpu_build_for_a_large_actor_it_can_run(tmp_path):
    from transformers import Qwen2Config

    from verl.workers.rollout.selection import VLLM_CPU_MIN_PARAMETERS

    large = VLLM_CPU_MIN_PARAMETERS
    assert _plan(parameters=large).rollout.engine == "vllm"
    assert _plan(parameters=large - 1).rollout.engine == "hf"
    assert _plan("actor_rollout_ref.rollout.name=hf", parameters=large).rollout.engine == "hf"
    # Head size 24: vLLM's CPU attention has no kernel for it, so auto keeps the HF engine.
    Qwen2Config(vocab_size=64, hidden_size=48, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
                intermediate_size=64).save_pretrained(tmp_path)
    assert _plan(f"actor_rollout_ref.model.path={tmp_path}", parameters=large).rollout.engine == "hf"


def test_sequence_parallel_groups_are_planned_and_checked(tiny_model_dir):
    from verl.utils.preflight import check_sequence_parallel_models

    sp = ("trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
          "actor_rollout_ref.actor.ppo_mini_batch_size=2", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2")
    plan = _plan(*sp, "trainer.cpu_ranks_per_node=4")
    # 4 ranks in 2 groups of 2: generation splits 8 sequences over 4 ranks, the actor's passes over 2 groups.
    assert (plan.n_ranks, plan.actor.sequence_parallel, plan.actor_dp, plan.rollout.rows_per_rank) == (4, 2, 2, 2)
    assert plan.actor.update.mini_batch == 2 * 2 // 2 and plan.critic.sequence_parallel == 1
    assert "sequence parallel over 2 ranks" in plan.describe()
    # A token budget is per GPU: a group's micro-batch holds sp times it, each rank 1/sp of its tokens (verl's rule).
    dynamic = _plan(*sp, "trainer.cpu_ranks_per_node=4", "actor_rollout_ref.actor.use_dynamic_bsz=true",
                    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=3000")
    assert dynamic.actor.update.micro.max_token_len == 6000 and dynamic.actor.forward.max_token_len == 6000
    # A large actor on one CPU node keeps the ranks its groups need.
    assert _plan(*sp, parameters=SHARED_ENGINE_MIN_PARAMETERS).n_ranks == 4
    with pytest.raises(ConfigError, match="ref.ulysses_sequence_parallel_size=1 must equal"):
        _plan(*sp, "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1")
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size=3 must divide the number of ranks 4"):
        validate_ppo_config(load_config(overrides=["trainer.n_gpus_per_node=4",
                                                   "actor_rollout_ref.actor.ulysses_sequence_parallel_size=3"]))
    # The model's heads must split over a group (the tiny model has 2).
    check_sequence_parallel_models(load_config(overrides=[f"actor_rollout_ref.model.path={tiny_model_dir}",
                                                          "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"]))
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.ulysses_sequence_parallel_size: "
                                          "ulysses_sequence_parallel_size=4 must divide the model's "
                                          "num_attention_heads=2"):
        check_sequence_parallel_models(load_config(overrides=[
            f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4"]))


def test_the_static_decode_loop_runs_on_cuda_unless_batches_vary():
    """rollout.static_decode=null: the HF engine's static loop on CUDA, except under verl's async agent loops, which
    hand the engine whatever requests are pending (a new shape nearly every call, each compiling its graph again);
    an explicit setting wins. The workers hand the engine the plan's answer."""
    hf, async_mode = "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.mode=async"
    assert _plan(hf, device="cuda").rollout.static_decode is True
    assert _plan(hf).rollout.static_decode is False
    assert _plan(hf, async_mode, device="cuda").rollout.static_decode is False
    assert _plan(hf, async_mode, "actor_rollout_ref.rollout.static_decode=true", device="cuda").rollout.static_decode
    assert _plan(hf, "actor_rollout_ref.rollout.static_decode=false", device="cuda").rollout.static_decode is False


# ------------------------------------------------------------------------------------------------ exact rollout
EXACT = "actor_rollout_ref.rollout.exact=true"


def test_exact_rollout_is_planned_and_its_log_probs_stand_in_for_the_pass_in_every_generation_mode():
    """rollout.exact=true: bit-equal log-probs, so bypass_mode=auto skips the old-log-prob pass for off-policy updates
    too, also with the tool rounds (where the default HF engine is recomputed)."""
    plan = plan_run(load_config(overrides=[*BASE, EXACT, "actor_rollout_ref.actor.ppo_mini_batch_size=2"]), "cpu")
    assert plan.rollout.exact and plan.old_log_prob_source == "rollout"
    assert not plan_run(load_config(overrides=BASE), "cpu").rollout.exact
    assert _source(EXACT, "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.rollout.mode=sync_with_tool") \
        == "rollout"
    assert _source(EXACT, "algorithm.rollout_correction.bypass_mode=false") == "recompute"  # asked for
    # LoRA: the actor's adapted layers run on the merged weight, as the engine's copy holds it
    assert _source(EXACT, "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.model.lora_rank=8") == "rollout"
    # the fused log-prob head takes the head's exact linear and log_softmax (tests/utils/test_exact_kernels.py)
    assert _source(EXACT, "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.model.use_fused_kernels=true") \
        == "rollout"


@pytest.mark.parametrize("override, named", [
    ("actor_rollout_ref.rollout.name=vllm", "rollout.name=vllm"),
    ("actor_rollout_ref.actor.use_torch_compile=true", "use_torch_compile=true"),
    ("+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2", "flash_attention_2"),
])
def test_exact_rollout_refuses_what_would_compute_log_probs_another_way(override, named):
    with pytest.raises(ConfigError, match="rollout.exact=true cannot hold") as err:
        plan_run(load_config(overrides=[*BASE, EXACT, override]), "cpu")
    assert named in str(err.value)


def test_exact_rollout_on_cuda_takes_the_triton_kernels_and_is_refused_without_triton(monkeypatch):
    from verl.utils import exact_triton

    monkeypatch.setattr(exact_triton, "TRITON_FOUND", True)
    hf = "actor_rollout_ref.rollout.name=hf"
    assert plan_run(load_config(overrides=[*BASE, EXACT, hf]), "cuda").rollout.exact
    monkeypatch.setattr(exact_triton, "TRITON_FOUND", False)
    with pytest.raises(ConfigError, match="trainer.device=cuda: exact mode's CUDA kernels are Triton's, and Triton is "
                                          "not installed"):
        plan_run(load_config(overrides=[*BASE, EXACT, hf]), "cuda")
