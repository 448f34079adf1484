import os
import re
from pathlib import Path

import pytest

from verl.trainer.config import load_config
from verl.trainer.main_ppo import main
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.utils.config import CONFIG_DIR, SHIPPED_CONFIGS, ConfigError, base_config, check_override_keys, parse_cli

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_defaults_load_and_validate():
    cfg = load_config()
    assert cfg.actor_rollout_ref.rollout.prompt_length == cfg.data.max_prompt_length
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    validate_ppo_config(cfg)


@pytest.mark.parametrize("name", SHIPPED_CONFIGS)
def test_base_config_is_hydras_composition_of_the_shipped_yaml(name):
    """compose_config takes a shipped config's keys from base_config (read without Hydra, once per process) to check
    overrides against: the two must be the same tree."""
    from omegaconf import OmegaConf

    assert OmegaConf.to_container(base_config(name)) == OmegaConf.to_container(_hydra_compose(name, []))


def _hydra_compose(name, overrides):
    """Hydra's own composition of a shipped config with overrides prepared as compose_config prepares them."""
    from hydra import compose, initialize_config_dir

    from verl.utils.config import _prepared_overrides

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=_prepared_overrides(base_config(name), overrides))


def _verl_keys_with_values():
    from verl.utils.config import NOT_CARRIED_KEYS, verl_only_keys

    return [f"{key}={_value_for(default)}" for key, default in verl_only_keys().items() if key not in NOT_CARRIED_KEYS]


@pytest.mark.parametrize("name, overrides", [
    ("ppo_trainer", ["actor_rollout_ref.rollout.n=8", "data.train_batch_size=32", "trainer.logger=[console,wandb]",
                     "+actor_rollout_ref.model.override_config.attention_dropout=0.0", "++trainer.new_key=1",
                     "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4", "~trainer.critic_warmup",
                     "trainer.experiment_name='a b=c'", "data.val_files=null",
                     "critic.optim.lr=${actor_rollout_ref.actor.optim.lr}",
                     "+actor_rollout_ref.actor.clip_ratio=0.3", "reward.reward_manager.name=dapo"]),
    ("ppo_trainer", "verl keys"),
    ("generation", ["rollout.temperature=0.7", "data.n_samples=4", "+rollout.engine_kwargs.vllm.seed=1"]),
    ("sft_trainer", ["data.train_batch_size=16", "optim.lr=1e-4"]),
    ("evaluation", ["data.path=x.parquet"]),
    ("ppo_trainer", ["hydra.run.dir=/tmp/elsewhere", "data.train_batch_size=4"]),  # Hydra's own key: its compose
])
def test_overrides_give_hydras_own_composition(name, overrides):
    """compose_config applies value overrides to base_config's tree itself (Hydra would read and parse every YAML
    file again for each load): the result is Hydra's compose of the same overrides, flags included."""
    from omegaconf import OmegaConf

    from verl.utils.config import apply_renamed_keys, compose_config
    from verl.utils.verl_keys import apply_verl_lora_section

    overrides = _verl_keys_with_values() if overrides == "verl keys" else overrides
    _, ours = compose_config(name, overrides)
    hydras = _hydra_compose(name, overrides)
    apply_renamed_keys(hydras)
    apply_verl_lora_section(hydras)
    assert OmegaConf.to_container(ours, resolve=False) == OmegaConf.to_container(hydras, resolve=False)
    assert OmegaConf.is_struct(ours) and OmegaConf.is_struct(hydras) and not OmegaConf.is_readonly(ours)


@pytest.mark.parametrize("override", ["data.train_batch_size=[1,", "~data.no_such_key",
                                      "actor_rollout_ref.rollout.engine_kwargs={vllm: {swap_space: 4}}"])
def test_an_override_hydra_cannot_apply_is_the_same_error(override):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from verl.utils.config import compose_config

    with pytest.raises(ConfigError) as ours:
        compose_config("ppo_trainer", [override])
    with pytest.raises((HydraException, OmegaConfBaseException)) as hydras:
        _hydra_compose("ppo_trainer", [override])
    assert str(hydras.value) in str(ours.value)


def test_the_typed_check_leaves_no_trace_between_configs():
    """The typed tree is built once and each check fills a copy: a value one config sets is not another's."""
    load_config(overrides=["actor_rollout_ref.rollout.n=8"])
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.n"):
        load_config(overrides=["actor_rollout_ref.rollout.n=eight"])
    assert load_config().actor_rollout_ref.rollout.n == base_config().actor_rollout_ref.rollout.n


def test_override_applies():
    cfg = load_config(overrides=["actor_rollout_ref.rollout.n=8", "data.train_batch_size=32"])
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.data.train_batch_size == 32


def test_typo_key_names_key_and_suggestion():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["actor_rollout_ref.actor.ppo_mini_batchsize=4"])
    message = str(err.value)
    assert "actor_rollout_ref.actor.ppo_mini_batchsize" in message
    assert "actor_rollout_ref.actor.ppo_mini_batch_size" in message  # the suggestion
    assert "+actor_rollout_ref" in message


def test_plus_prefix_adds_a_new_key():
    cfg = load_config(overrides=["+actor_rollout_ref.model.override_config.attention_dropout=0.0"])
    assert cfg.actor_rollout_ref.model.override_config.attention_dropout == 0.0


@pytest.mark.parametrize("override, fragment", [
    ("data.train_batch_size=abc", "data.train_batch_size='abc' must be an integer"),
    ("actor_rollout_ref.actor.use_kl_loss=3", "must be true/false"),
    ("actor_rollout_ref.actor.clip_ratio=wide", "must be a number"),
])
def test_wrong_type_names_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(overrides=[override])


def test_int_accepted_for_float():
    cfg = load_config(overrides=["actor_rollout_ref.actor.clip_ratio=1"])
    assert cfg.actor_rollout_ref.actor.clip_ratio == 1


def test_batch_size_not_dividing():
    cfg = load_config(overrides=["data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=8"])
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg)
    assert "data.train_batch_size=12 must be divisible by actor_rollout_ref.actor.ppo_mini_batch_size=8" in str(err.value)


def test_responses_not_dividing_ranks():
    cfg = load_config(overrides=["data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                                 "actor_rollout_ref.rollout.n=1", "trainer.n_gpus_per_node=2"])
    with pytest.raises(ConfigError, match="3 responses must be divisible by the number of ranks"):
        validate_ppo_config(cfg)


def test_micro_batch_not_dividing():
    cfg = load_config(overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"])
    with pytest.raises(ConfigError, match="ppo_micro_batch_size_per_gpu=5"):
        validate_ppo_config(cfg)


def test_unknown_names_and_missing_files():
    cfg = load_config(overrides=["algorithm.adv_estimator=nope", "actor_rollout_ref.actor.policy_loss.loss_mode=x",
                                 "data.train_files=/no/such.parquet", "trainer.device=tpu"])
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg)
    message = str(err.value)
    for fragment in ("algorithm.adv_estimator='nope'", "grpo", "loss_mode='x'", "vanilla",
                     "data.train_files: file not found: /no/such.parquet", "trainer.device='tpu'"):
        assert fragment in message


def test_dynamic_bsz_budget_too_small():
    cfg = load_config(overrides=["actor_rollout_ref.actor.use_dynamic_bsz=true",
                                 "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64"])
    with pytest.raises(ConfigError, match="ppo_max_token_len_per_gpu=64 must be at least"):
        validate_ppo_config(cfg)


def test_parse_cli_config_flags():
    config_dir, name, overrides = parse_cli(["--config-name=ppo_trainer.yaml", "-cp", "/tmp/x", "a.b=1"])
    assert (config_dir, name, overrides) == ("/tmp/x", "ppo_trainer", ["a.b=1"])


def test_main_exits_2_with_message_before_anything_starts(capsys):
    assert main(["trainer.total_epoch=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'trainer.total_epoch'" in err and "trainer.total_epochs" in err


def test_string_accepted_for_a_one_item_list():
    cfg = load_config(overrides=["trainer.logger=console"])
    assert cfg.trainer.logger == "console"


@pytest.mark.parametrize("overrides, mode", [
    ([], "vanilla"),
    (["actor_rollout_ref.actor.use_archer_policy_loss=true"], "aspo"),
    (["actor_rollout_ref.actor.use_token_entropy_separate=true"], "archer"),
    (["actor_rollout_ref.actor.enable_entropy_balanced_clipping=true"], "aepo"),
    # Archer2.0's scripts (fixed): ASPO loss, KL split by entropy.
    (["actor_rollout_ref.actor.use_archer_policy_loss=true", "actor_rollout_ref.actor.use_token_entropy_separate=true"],
     "aspo"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=aepo", "actor_rollout_ref.actor.enable_entropy_balanced_clipping=true"],
     "aepo"),
])
def test_seed_switches_select_the_loss_mode(overrides, mode):
    cfg = load_config(overrides=overrides)
    validate_ppo_config(cfg)
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == mode


def test_loss_mode_archer_turns_on_the_entropy_split_kl():
    cfg = load_config(overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=archer"])
    validate_ppo_config(cfg)
    assert cfg.actor_rollout_ref.actor.use_token_entropy_separate is True


@pytest.mark.parametrize("overrides, fragment", [
    (["actor_rollout_ref.actor.policy_loss.loss_mode=aepo", "actor_rollout_ref.actor.use_archer_policy_loss=true"],
     r"use_archer_policy_loss=true selects loss_mode aspo, but .*loss_mode=aepo"),
    (["actor_rollout_ref.actor.use_dynamic_clip=true"], r"use_dynamic_clip=true has no effect"),
    (["actor_rollout_ref.actor.token_entropy_quantile=1.0"], r"token_entropy_quantile=1.0 must be in \(0, 1\)"),
    (["actor_rollout_ref.actor.negative_clip_ratio_c=1.0"], r"negative_clip_ratio_c=1.0 must be > 1"),
    (["reward_model.overlong_buffer.enable=true"],
     r"overlong_buffer.len=0 must be in \(0, data.max_response_length=48\)"),
    (["algorithm.filter_groups.enable=true", "trainer.rejection_sample=true"],
     r"set only one of algorithm.filter_groups.enable"),
    (["data.gen_batch_size=48"], r"data.gen_batch_size=48 differs from data.train_batch_size=16"),
])
def test_seed_option_errors_name_the_keys(overrides, fragment):
    cfg = load_config(overrides=overrides)
    with pytest.raises(ConfigError, match=fragment):
        validate_ppo_config(cfg)


@pytest.mark.parametrize("installed", [pytest.param(True, marks=pytest.mark.vllm), False])
def test_vllm_settings_are_checked_before_anything_starts(tmp_path, monkeypatch, installed):
    """Every problem at once, whether vLLM is installed or not (the settings are checked either way)."""
    import importlib.util

    from verl.demo.tiny_model import build_tiny_model

    real_find_spec = importlib.util.find_spec
    if not installed:
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else
                            real_find_spec(name, *a))

    narrow_heads = build_tiny_model(str(tmp_path / "model"), num_heads=4, num_kv_heads=2)  # head size 16
    cfg = load_config(overrides=[
        "actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu", "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=3", f"actor_rollout_ref.model.path={narrow_heads}",
        "actor_rollout_ref.rollout.mode=sync_with_tool", "actor_rollout_ref.rollout.entropy_mode=exact"])
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg)
    message = str(err.value)
    for fragment in ("actor_rollout_ref.rollout.tensor_model_parallel_size=3 must be a positive integer dividing "
                     "the 2 ranks", "actor_rollout_ref.rollout.entropy_mode=exact needs full-vocabulary entropies"):
        assert fragment in message
    # The head sizes vLLM's CPU build supports are vLLM's to say.
    assert ("actor_rollout_ref.rollout.name=vllm on CPU: the model's attention head size is 16" in message) is installed
    assert ("actor_rollout_ref.rollout.name=vllm needs vLLM: pip install" in message) is not installed
    # The HF engine has no tensor parallelism to configure: verl scripts that set it still run.
    validate_ppo_config(load_config(overrides=["actor_rollout_ref.rollout.name=hf", "trainer.device=cpu",
                                               "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]))


def test_an_engine_added_with_register_rollout_passes_validation():
    from verl.workers.rollout.base import RolloutEngine
    from verl.workers.rollout.registry import ROLLOUT_REGISTRY, register_rollout

    cfg = load_config(overrides=["actor_rollout_ref.rollout.name=my_engine"])
    with pytest.raises(ConfigError, match="rollout.name='my_engine' must be one of auto, hf, openai, sglang, trtllm, vllm"):
        validate_ppo_config(cfg)
    register_rollout("my_engine")(type("MyEngine", (RolloutEngine,), {}))
    try:
        validate_ppo_config(cfg)
    finally:
        del ROLLOUT_REGISTRY["my_engine"]


def test_verl_keys_that_do_nothing_are_announced_once_each(capsys):
    from verl.trainer.ppo.config_rules import INERT_KEYS, announce_inert_keys

    assert announce_inert_keys(load_config(), "hf") == []  # the defaults say nothing
    cfg = load_config(overrides=["actor_rollout_ref.model.use_shm=true", "trainer.use_legacy_worker_impl=disable",
                                 "actor_rollout_ref.actor.checkpoint.load_contents=[model]"])
    keys = announce_inert_keys(cfg, "hf")
    assert keys == ["actor_rollout_ref.model.use_shm", "actor_rollout_ref.actor.checkpoint.load_contents",
                    "trainer.use_legacy_worker_impl"]
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == ("[config] actor_rollout_ref.model.use_shm=true is accepted for verl scripts but does "
                        "nothing in Quiver: " + INERT_KEYS["actor_rollout_ref.model.use_shm"])
    assert len(lines) == 3 and 'load_contents=["model"]' in lines[1]


def test_every_inert_key_exists_in_the_config():
    from omegaconf import OmegaConf

    from verl.trainer.ppo.config_rules import INERT_KEYS

    cfg = load_config()
    missing = [key for key in INERT_KEYS if OmegaConf.select(cfg, key, default="<missing>") == "<missing>"]
    assert missing == []


def test_fsdp_compute_dtype_is_checked():
    cfg = load_config(overrides=["actor_rollout_ref.actor.fsdp_config.dtype=int8"])
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.fsdp_config.dtype='int8' must be one of bf16"):
        validate_ppo_config(cfg)


def test_default_of_reads_the_yaml_and_names_an_unknown_key():
    from verl.utils.config import default_of, option

    assert default_of("actor_rollout_ref.actor.clip_ratio") == 0.2
    assert default_of("actor_rollout_ref.rollout.entropy_top_k") == 10  # from the rollout group
    assert default_of("rollout.name", "generation") == "hf"
    assert option({"clip_ratio": None}, "clip_ratio", "actor_rollout_ref.actor") == 0.2
    assert option({"clip_ratio": 0.3}, "clip_ratio", "actor_rollout_ref.actor") == 0.3
    with pytest.raises(KeyError, match="'actor_rollout_ref.actor.nope' is not a key of ppo_trainer.yaml"):
        default_of("actor_rollout_ref.actor.nope")


def test_save_contents_names_are_checked():
    cfg = load_config(overrides=["actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model,weights]"])
    with pytest.raises(ConfigError, match=r"save_contents: \['weights'\] are not among model, optimizer, extra"):
        validate_ppo_config(cfg)


@pytest.mark.parametrize("module", ["dapo.main_dapo", "recipe.dapo.main_dapo"])
@pytest.mark.filterwarnings("ignore:.* found in sys.modules after import of package:RuntimeWarning")
def test_the_seeds_dapo_entry_points_are_main_ppo(module, capsys, monkeypatch):
    """`python -m <module> ...` as the module runs under `-m` (its `__main__` block and exit code), in this process:
    a new interpreter would only import torch and Quiver again. main_ppo's own real-process runs:
    tests/e2e/test_bad_input.py and tests/e2e/test_checkpoint_resume.py."""
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", [module, "trainer.total_epoch=3"])
    with pytest.raises(SystemExit) as result:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert result.value.code == 2 and "unknown config key 'trainer.total_epoch'" in capsys.readouterr().err


def test_vllm_only_keys_are_announced_when_the_engine_is_hf(capsys):
    from verl.trainer.ppo.config_rules import announce_inert_keys

    overrides = ["actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                 "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"]
    keys = announce_inert_keys(load_config(overrides=["actor_rollout_ref.rollout.name=hf", *overrides]), "hf")
    assert keys == ["actor_rollout_ref.rollout.tensor_model_parallel_size",
                    "actor_rollout_ref.rollout.gpu_memory_utilization"]
    assert "only the vllm, sglang and trtllm engines read it, and this run's engine is hf" in capsys.readouterr().out
    assert announce_inert_keys(load_config(overrides=["actor_rollout_ref.rollout.name=vllm", *overrides]),
                               "vllm") == []


def test_rollout_dtype_is_read_by_the_hf_engine_on_cuda_only(capsys):
    from verl.trainer.ppo.config_rules import announce_inert_keys

    cfg = load_config(overrides=["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.dtype=float16"])
    assert announce_inert_keys(cfg, "hf", "cpu") == ["actor_rollout_ref.rollout.dtype"]
    assert "this run's engine is hf on cpu (the hf engine reads it on CUDA)" in capsys.readouterr().out
    assert announce_inert_keys(cfg, "hf", "cuda") == []


def test_a_verl_key_quiver_does_not_carry_says_so_and_why():
    with pytest.raises(ConfigError, match=r"critic.model.lora_rank .* is a verl key Quiver does not carry: the critic "
                                          r"is always a full FSDP2 model"):
        check_override_keys(base_config("ppo_trainer"), ["critic.model.lora_rank=8"])


def test_the_endpoint_engine_is_refused_for_training():
    cfg = load_config(overrides=["actor_rollout_ref.rollout.name=openai"])
    with pytest.raises(ConfigError, match="rollout.name=openai sends requests to a served model.*use hf or vllm"):
        validate_ppo_config(cfg)


# ---- verl 0.9's keys that Quiver's tree lacks (verl/trainer/config/verl_0_9_keys.tsv) ----------------------------
def _value_for(default: str) -> str:
    """An override value of the type of verl's default `default` (null where verl's default is null or interpolated;
    strings quoted for Hydra's override grammar)."""
    from verl.utils.config import _verl_default_type

    kind = _verl_default_type(default)
    if kind is None:
        return "null"
    if kind is str:
        return "'" + default.replace("'", "\\'") + "'"
    return default.replace("'", '"') if default.startswith(("[", "{")) else default


def test_every_verl_key_is_accepted_and_announced_with_its_reason(capsys):
    """The key walk: every verl 0.9.1 ppo_trainer key Quiver's own tree lacks can be set at once, on top of Quiver's
    own keys; each lands in the config and is announced once as doing nothing here, with a reason -- except verl
    0.9's new spellings of Quiver's keys (RENAMED_KEYS), which set those."""
    from omegaconf import OmegaConf

    from verl.trainer.ppo.config_rules import announce_inert_keys
    from verl.utils.config import NOT_CARRIED_KEYS, RENAMED_KEYS, _flatten, verl_key_reason, verl_only_keys
    from verl.utils.verl_keys import LORA_KEYS, LORA_SECTION

    keys = {key: default for key, default in verl_only_keys().items() if key not in NOT_CARRIED_KEYS}
    assert len(keys) > 500 and not set(keys) & set(_flatten(base_config()))
    cfg = load_config(overrides=[f"{key}={_value_for(default)}" for key, default in keys.items()])
    mapped = set(RENAMED_KEYS) | {f"{LORA_SECTION}.{key}" for key in LORA_KEYS}  # they set Quiver's keys
    inert = {key: default for key, default in keys.items() if key not in mapped}
    assert all(OmegaConf.select(cfg, key, default="<missing>") != "<missing>" for key in inert)
    assert cfg.custom_reward_function.name == "compute_score" and cfg.reward_model.reward_manager == "naive"
    announced = announce_inert_keys(cfg, "hf")
    assert set(inert) <= set(announced) and not mapped & set(announced)
    lines = capsys.readouterr().out.splitlines()
    line = next(line for line in lines if line.startswith("[config] global_profiler.tool="))
    assert line.endswith(verl_key_reason("global_profiler.tool")) and "profiler" in line
    assert verl_key_reason("data.image_key").startswith("Quiver trains text-only models")


# A copy of ../shared/specs/verl_keys/example_script_keys.tsv (the keys verl's example scripts set).
SCRIPT_KEYS = os.path.join(os.path.dirname(__file__), "..", "data", "verl_example_script_keys.tsv")


def test_every_key_of_verls_example_scripts_passes_with_its_usual_value():
    """The keys of verl 0.9.1's schema that verl's 127 main_ppo example scripts set, each with the value the scripts
    write most often (shell variables left out): together they compose through Quiver's check."""
    from omegaconf import OmegaConf

    rows = [line.rstrip("\n").split("\t") for line in open(SCRIPT_KEYS) if line.strip() and not line.startswith("#")]
    from verl.utils.verl_keys import LORA_KEYS, LORA_SECTION, REFUSED_VALUES

    rows = [(key, value) for key, _, value, in_verl, _ in rows if in_verl == "yes" and value and "$" not in value]
    assert len(rows) > 150
    # Values asking for what Quiver does not build (MTP, DoRA-like LoRA, adapter dropout) are refused, each naming
    # its key; every other key composes (over_sample_rate=0.1 of the multi-turn scripts among them).
    refused = [(key, value) for key, value in rows if key in REFUSED_VALUES
               and value.strip('"') not in {str(same) for same in REFUSED_VALUES[key][0]}]
    assert "actor_rollout_ref.model.mtp.enable" in {key for key, _ in refused}
    assert ("actor_rollout_ref.rollout.over_sample_rate", "0.1") in rows
    for key, value in refused:
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config(overrides=[f"{key}={value}"])
    # verl 0.9's LoRA section sets Quiver's LoRA keys, which other scripts set to other values: composed apart.
    mapped = {f"{LORA_SECTION}.{key}" for key in LORA_KEYS}
    load_config(overrides=[f"{key}={value}" for key, value in rows if key in mapped])
    rows = [(key, value) for key, value in rows if (key, value) not in refused and key not in mapped]
    cfg = load_config(overrides=[f"{key}={value}" for key, value in rows])  # a ConfigError lists every key at fault
    assert all(OmegaConf.select(cfg, key, default="<missing>") != "<missing>" for key, _ in rows)


def test_verl_0_9s_reward_section_spellings_set_quivers_keys(capsys):
    """verl 0.9 moved reward settings under `reward.` (reward.custom_reward_function.path, reward.reward_manager.name,
    reward.reward_model.*): both spellings work, neither is announced as inert, and a clash is an error."""
    from verl.trainer.ppo.config_rules import announce_inert_keys

    cfg = load_config(overrides=["reward.custom_reward_function.path=/tmp/my_reward.py",
                                 "reward.custom_reward_function.name=score", "reward.reward_manager.name=dapo",
                                 "reward.reward_model.enable=true", "reward.reward_model.model_path=/models/rm"])
    assert cfg.custom_reward_function.path == "/tmp/my_reward.py" and cfg.custom_reward_function.name == "score"
    assert cfg.reward_model.reward_manager == "dapo"
    assert cfg.reward_model.enable is True and cfg.reward_model.model.path == "/models/rm"
    announce_inert_keys(cfg, "hf")
    assert "reward." not in "".join(line for line in capsys.readouterr().out.splitlines()
                                    if line.startswith("[config] reward."))
    with pytest.raises(ConfigError, match="reward.reward_manager.name='prime' and reward_model.reward_manager='dapo'"):
        load_config(overrides=["reward.reward_manager.name=prime", "reward_model.reward_manager=dapo"])


def test_a_verl_key_with_a_value_of_the_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.calculate_entropy='often' has the wrong type"):
        load_config(overrides=["actor_rollout_ref.actor.calculate_entropy=often"])
    cfg = load_config(overrides=["actor_rollout_ref.actor.entropy_from_logits_chunk_size=4096",
                                 "reward_model.use_reward_loop=true"])  # an int for an int; a key of older verl
    assert cfg.actor_rollout_ref.actor.entropy_from_logits_chunk_size == 4096


def test_a_typo_of_a_verl_only_key_is_still_unknown():
    with pytest.raises(ConfigError, match="unknown config key 'global_profiler.tol'"):
        load_config(overrides=["global_profiler.tol=nsys"])


def test_verl_async_mode_runs_verls_agent_loops_and_plans_the_old_log_probs():
    """rollout.mode=async, verl 0.9's default: the per-sample agent loops (not the round-based tool loop, even with
    multi_turn.enable); with plain single-turn loops the HF engine's log-probs on the CPU stay exact, with tools
    the actor recomputes them."""
    from verl.trainer.ppo.run_plan import plan_run
    from verl.workers.rollout.modes import uses_agent_loop, uses_async_agent

    base = ["actor_rollout_ref.rollout.mode=async", "trainer.device=cpu", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.actor.ppo_epochs=2"]
    cfg = load_config(overrides=[*base, "actor_rollout_ref.rollout.multi_turn.enable=true"])
    validate_ppo_config(cfg)
    rollout = cfg.actor_rollout_ref.rollout
    assert uses_async_agent(rollout) and not uses_agent_loop(rollout)
    plan = plan_run(cfg, "cpu", actor_parameters=1000)
    assert plan.rollout.generation == "agent_loops" and plan.old_log_prob_source == "rollout"
    cfg = load_config(overrides=[*base, "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"])
    assert plan_run(cfg, "cpu", actor_parameters=1000).old_log_prob_source == "recompute"


def test_verls_multi_turn_example_runs_verls_agent_loops_without_naming_the_mode():
    """verl's GSM8K multi-turn config sets multi_turn.enable and a tool YAML and leaves the mode to verl 0.9's default
    (async): its tools are called by verl's agent loops, not by the seeds' loop (which would call none of them)."""
    from verl.workers.rollout.modes import uses_agent_loop, uses_async_agent

    tools = f"actor_rollout_ref.rollout.multi_turn.tool_config_path={CONFIGS / 'tools' / 'gsm8k_tool.yaml'}"
    cfg = load_config(overrides=["actor_rollout_ref.rollout.multi_turn.enable=true", tools])
    validate_ppo_config(cfg)
    assert uses_async_agent(cfg.actor_rollout_ref.rollout) and not uses_agent_loop(cfg.actor_rollout_ref.rollout)
    cfg = load_config(overrides=["actor_rollout_ref.rollout.multi_turn.enable=true"])  # the seeds' keys: their loop
    assert uses_agent_loop(cfg.actor_rollout_ref.rollout) and not uses_async_agent(cfg.actor_rollout_ref.rollout)
    with pytest.raises(ConfigError, match="verl-style tools are called by verl's agent loops .* not by "
                                          ".*mode=sync_with_tool, the seeds' loop"):
        validate_ppo_config(load_config(overrides=["actor_rollout_ref.rollout.mode=sync_with_tool", tools]))


def test_a_verl_example_config_starts_from_ppo_trainer_in_any_working_directory(tmp_path, monkeypatch):
    """verl's example configs say `defaults: [ppo_trainer, _self_]` and find it through `hydra.searchpath:
    [file://verl/trainer/config]`, relative to verl's checkout: Quiver's folder is searched after theirs, quietly."""
    import warnings

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "my_example.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\n\ndefaults:\n  - ppo_trainer\n  - _self_\n\n"
        "data:\n  max_prompt_length: 1024\n  return_raw_chat: True\n")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_config(config_dir=str(tmp_path / "config"), config_name="my_example",
                          overrides=["data.max_response_length=64"])
    assert (cfg.data.max_prompt_length, cfg.data.return_raw_chat, cfg.data.max_response_length) == (1024, True, 64)
    assert cfg.actor_rollout_ref.rollout.n == load_config().actor_rollout_ref.rollout.n  # the rest is ppo_trainer's


def test_async_mode_names_what_it_cannot_do_and_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match="ARPO's branching runs tool_agent loops; set .*default_agent_loop"):
        validate_ppo_config(load_config(overrides=["actor_rollout_ref.rollout.mode=async",
                                                   "actor_rollout_ref.rollout.beam_size=2"]))
    validate_ppo_config(load_config(overrides=["actor_rollout_ref.rollout.mode=async",
                                               "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
                                               "actor_rollout_ref.rollout.beam_size=2"]))  # ARPO: fine
    with pytest.raises(ConfigError, match="AEPO's branch penalty .* run in .*mode=sync_with_tool"):
        validate_ppo_config(load_config(overrides=["actor_rollout_ref.rollout.mode=async",
                                                   "actor_rollout_ref.rollout.beam_size=2",
                                                   "actor_rollout_ref.rollout.branch_rule=aepo"]))
    missing = tmp_path / "tools.yaml"
    with pytest.raises(ConfigError, match=r"multi_turn.tool_config_path='.*tools.yaml': no such file"):
        validate_ppo_config(load_config(overrides=["actor_rollout_ref.rollout.mode=async",
                                                   f"actor_rollout_ref.rollout.multi_turn.tool_config_path={missing}"]))
    with pytest.raises(ConfigError, match="max_parallel_calls=0 must be >= 1"):
        validate_ppo_config(load_config(overrides=["actor_rollout_ref.rollout.multi_turn.max_parallel_calls=0"]))


def test_an_engine_that_cannot_run_here_runs_on_autos_choice_and_says_so(capsys, monkeypatch):
    """rollout.name=sglang (18 of verl's FSDP example scripts) is SGLang's engine on CUDA where sglang is installed;
    elsewhere it resolves as auto (the HF engine here, where vLLM's CPU build is not picked for the tiny shapes), with
    one line naming why and the engine the run uses. trtllm, which Quiver does not have, does the same."""
    import importlib.util

    from verl.trainer.ppo.config_rules import announce_inert_keys
    from verl.trainer.ppo.run_plan import plan_run
    from verl.workers.rollout.selection import resolve_rollout_name

    cfg = load_config(overrides=["actor_rollout_ref.rollout.name=sglang", "trainer.device=cpu",
                                 "actor_rollout_ref.rollout.gpu_memory_utilization=0.7"])
    validate_ppo_config(cfg)
    engine = plan_run(cfg, "cpu", actor_parameters=1000).rollout.engine
    assert engine == "hf"
    announce_inert_keys(cfg, engine, "cpu")
    printed = capsys.readouterr().out
    assert ("[config] actor_rollout_ref.rollout.name=sglang: the SGLang engine runs on CUDA only (device is cpu); this "
            "run uses hf, what rollout.name=auto picks here") in printed
    assert "gpu_memory_utilization=0.7 is accepted for verl scripts but does nothing" in printed
    # On CUDA: SGLang's engine where sglang is installed (then its keys are read), auto's choice where it is not.
    real_find_spec = importlib.util.find_spec
    for installed in (True, False):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, installed=installed: (object() if installed else None)
                            if name == "sglang" else real_find_spec(name, *a))
        assert resolve_rollout_name("sglang", "cuda") == ("sglang" if installed else resolve_rollout_name("auto",
                                                                                                          "cuda"))
    # verl's SGLang scripts often ask for tensor parallelism, which Quiver's SGLang engine lacks: auto's engine runs
    # them (vLLM's tensor-parallel groups where vLLM is installed), with the reason in one line.
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "sglang" else real_find_spec(name, *a))
    assert resolve_rollout_name("sglang", "cuda", tensor_parallel=2) == resolve_rollout_name("auto", "cuda")
    tp = load_config(overrides=["actor_rollout_ref.rollout.name=sglang",
                                "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    announce_inert_keys(tp, "vllm", "cuda")
    assert ("[config] actor_rollout_ref.rollout.name=sglang: Quiver's SGLang engine runs one single-GPU engine per "
            "rank, without the tensor parallelism asked for (tensor_model_parallel_size=2); this run uses vllm"
            in capsys.readouterr().out)
    assert announce_inert_keys(cfg, "sglang", "cuda") == []
    assert "name=sglang" not in capsys.readouterr().out
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    cfg = load_config(overrides=["actor_rollout_ref.rollout.name=trtllm", "trainer.device=cpu"])
    announce_inert_keys(cfg, "hf", "cpu")
    assert ("[config] actor_rollout_ref.rollout.name=trtllm: the TensorRT-LLM engine runs on CUDA only (device is cpu); "
            "this run uses hf" in capsys.readouterr().out)
    assert resolve_rollout_name("trtllm", "cuda") == resolve_rollout_name("auto", "cuda")  # tensorrt_llm missing


def test_a_relative_config_path_is_resolved_from_the_entry_points_folder_as_hydra_does(tmp_path, monkeypatch):
    """verl's scripts write `--config-path=config` (its configs sit beside verl/trainer/main_ppo.py): it finds
    Quiver's own there whatever the working directory; a relative path that is not beside the entry point is taken
    from the working directory (the seeds' configs/ folder)."""
    from verl.utils.config import CONFIG_DIR

    entry = os.path.join(os.path.dirname(CONFIG_DIR), "main_ppo.py")
    monkeypatch.chdir(tmp_path)
    assert parse_cli(["--config-path=config", "--config-name=ppo_trainer"], entry_file=entry)[0] == CONFIG_DIR
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "ppo_trainer.yaml").write_text("defaults: [quiver_ppo_trainer, _self_]\n")
    assert parse_cli(["--config-path", "configs"], entry_file=entry)[0] == str(tmp_path / "configs")


def test_archers_entry_point_grades_with_archers_reward_function():
    """The seed's dapo/main_dapo.py always grades with its own reward function: Archer's math sets (math, aime2024,
    ...) by their \\boxed{} answer, 1 / 0, where verl's router gives math and aime* DAPO's rule (+1 / -1)."""
    from dapo.main_dapo import ARCHER_REWARD, archer_argv
    from verl.trainer.ppo.reward import get_custom_reward_fn

    argv = archer_argv(["data.train_batch_size=4"])
    assert argv == ["data.train_batch_size=4", f"custom_reward_function.path={ARCHER_REWARD}"]
    assert archer_argv(["custom_reward_function.path=mine.py"]) == ["custom_reward_function.path=mine.py"]
    fn = get_custom_reward_fn(load_config(overrides=argv[1:]))
    assert fn("aime2024", "so \\boxed{42}", "42") == 1.0 and fn("aime2024", "so \\boxed{41}", "42") == 0.0
