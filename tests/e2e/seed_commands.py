"""The `python3 -m verl.trainer.main_ppo` arguments of the seeds' published launch scripts, as a user runs them:
ARPO's ARPO_7B_Reasoning_1node.sh and AEPO's AEPO_Qwen3_14B_DeepResearch.sh. `{NAME}` is a shell variable of the
script; a test fills in the paths, sizes and hardware (what a user changes) and leaves ENABLE_MULTI_TURN, which
the scripts never set, empty."""

ARPO_REASONING = [
    "--config-path={CONFIG_PATH}", "--config-name={CONFIG_NAME}",
    "algorithm.adv_estimator=grpo", "algorithm.kl_ctrl.kl_coef=0.0",
    "data.train_files={TRAIN_FILES}", "data.val_files={VALID_FILES}", "data.prompt_key={PROMPT_KEY}",
    "data.train_batch_size={TRAIN_BATCH_SIZE}", "data.max_prompt_length={MAX_PROMPT_LENGTH}",
    "data.max_response_length={MAX_RESPONSE_LENGTH}",
    "actor_rollout_ref.model.path={ACTOR_MODEL_PATH}", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size={PPO_MINI_BATCH_SIZE}", "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu={TOKENS_X2}", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.0", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={TOKENS_X4}",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
    "actor_rollout_ref.rollout.mode={ROLLOUT_MODE}", "actor_rollout_ref.rollout.gpu_memory_utilization=0.7",
    "actor_rollout_ref.rollout.n={ROLLOUT_N}", "actor_rollout_ref.rollout.initial_rollouts={INITIAL_ROLLOUTS}",
    "actor_rollout_ref.rollout.beam_size={BEAM_SIZE}",
    "actor_rollout_ref.rollout.branch_probability={BRANCH_PROBABILITY}",
    "actor_rollout_ref.rollout.entropy_weight={Entropy_weight}",
    "actor_rollout_ref.rollout.tools.tool_instances.search.params.cache_file={SEARCH_CACHE_PATH}",
    "actor_rollout_ref.rollout.tools.tool_instances.search.class_path={SEARCH_CLASS_PATH}",
    "actor_rollout_ref.rollout.multi_turn.enable={ENABLE_MULTI_TURN}",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={TOKENS_X4}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "reward_model.reward_manager={REWARD_MANAGER}",
    "custom_reward_function.path={CUSTOM_REWARD_FUNCTION_PATH}",
    "custom_reward_function.name={CUSTOM_REWARD_FUNCTION_NAME}",
    "trainer.critic_warmup=0", "trainer.logger=[console, wandb]", "trainer.project_name={PROJECT_NAME}",
    "trainer.experiment_name={EXPERIMENT_NAME}", "trainer.n_gpus_per_node={N_GPUS_PER_NODE}",
    "trainer.nnodes={NNODES}", "trainer.save_freq={SAVE_FREQ}", "trainer.test_freq={TEST_FREQ}",
    "trainer.total_epochs={TOTAL_EPOCHS}", "trainer.default_local_dir={SAVE_PATH}",
    "trainer.val_before_train=False", "trainer.rollout_data_dir={ROLLOUT_SAVE_PATH}",
    "hydra.run.dir={SAVE_PATH}/outputs",
]

# AEPO's deep-research script: its own switches, a list of validation files, `++` on the search cache, and the
# seed's config's own search class path (the script sets none).
AEPO_DEEP_RESEARCH = [
    arg for arg in ARPO_REASONING
    if ".search.class_path=" not in arg and ".search.params.cache_file=" not in arg
] + [
    "actor_rollout_ref.actor.enable_entropy_balanced_clipping={ENABLE_ENTROPY_BALANCED_CLIPPING}",
    "actor_rollout_ref.actor.enable_entropy_balanced_advantage={ENABLE_ENTROPY_BALANCED_ADVANTAGE}",
    "actor_rollout_ref.rollout.enable_dynamic_rollouts={ENABLE_DYNAMIC_ROLLOUTS}",
    "++actor_rollout_ref.rollout.tools.tool_instances.search.params.cache_file={SEARCH_CACHE_PATH}",
]


def command(template: list[str], variables: dict[str, object]) -> list[str]:
    """The arguments as the shell passes them: each `{NAME}` replaced by the variable's value ('' when unset)."""
    class Unset(dict):
        def __missing__(self, key):
            return ""

    return [arg.format_map(Unset(variables)) for arg in template]
