"""The overrides of verl's example launch scripts (examples/grpo_trainer/run_qwen2-7b.sh,
examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh, recipe/dapo/run_dapo_qwen2.5_32b.sh,
examples/ppo_trainer/run_deepseek7b_llm.sh), as a user runs them. `{NAME}` marks what a user changes: paths, sizes
and hardware."""

# The actor and rollout settings both GSM8K GRPO examples share.
_GSM8K_GRPO_ACTOR_ROLLOUT = [
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH_SIZE}",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}",
    "actor_rollout_ref.rollout.tensor_model_parallel_size={TP}", "actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n={N}",
]

GRPO_QWEN2_7B = [
    "algorithm.adv_estimator=grpo", "data.train_files={TRAIN_FILE}", "data.val_files={TEST_FILE}",
    "data.train_batch_size={TRAIN_BATCH_SIZE}", "data.max_prompt_length={MAX_PROMPT_LENGTH}",
    "data.max_response_length={MAX_RESPONSE_LENGTH}", "data.filter_overlong_prompts=True", "data.truncation='error'",
    "actor_rollout_ref.model.path={MODEL_PATH}", "actor_rollout_ref.actor.optim.lr=1e-6",
    *_GSM8K_GRPO_ACTOR_ROLLOUT,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", "trainer.logger=['console','wandb']",
    "trainer.project_name='verl_grpo_example_gsm8k'", "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node={N_GPUS}", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
    "trainer.total_epochs={TOTAL_EPOCHS}", "trainer.default_local_dir={CKPTS_DIR}",
]

GRPO_QWEN2_5_3B_LORA = [
    "algorithm.adv_estimator=grpo", "trainer.val_before_train=False", "data.train_files={TRAIN_FILE}",
    "data.val_files={TEST_FILE}", "data.train_batch_size={TRAIN_BATCH_SIZE}",
    "data.max_prompt_length={MAX_PROMPT_LENGTH}", "data.max_response_length={MAX_RESPONSE_LENGTH}",
    "data.filter_overlong_prompts=True", "data.truncation='error'", "data.shuffle=False",
    "actor_rollout_ref.model.path={MODEL_PATH}", "actor_rollout_ref.model.lora_rank={LORA_RANK}",
    "actor_rollout_ref.model.lora_alpha=32", "actor_rollout_ref.actor.optim.lr=3e-6",
    *_GSM8K_GRPO_ACTOR_ROLLOUT,
    "actor_rollout_ref.rollout.load_format=safetensors", "actor_rollout_ref.rollout.layered_summon=True",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", 'trainer.logger=["console","wandb"]', "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2.5_3b_grpo_lora'", "trainer.n_gpus_per_node={N_GPUS}", "trainer.nnodes=1",
    "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs={TOTAL_EPOCHS}",
    "trainer.default_local_dir={CKPTS_DIR}",
]

# PPO with a critic (GAE) of verl 0.5-0.9; the critic's model is the actor's.
PPO_DEEPSEEK_7B = [
    "algorithm.adv_estimator=gae", "data.train_files={TRAIN_FILE}", "data.val_files={TEST_FILE}",
    "data.train_batch_size={TRAIN_BATCH_SIZE}", "data.max_prompt_length={MAX_PROMPT_LENGTH}",
    "data.max_response_length={MAX_RESPONSE_LENGTH}", "data.filter_overlong_prompts=True", "data.truncation='error'",
    "actor_rollout_ref.model.path={MODEL_PATH}", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH_SIZE}",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size={TP}", "actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "critic.optim.lr=1e-5", "critic.model.use_remove_padding=True",
    "critic.model.path={MODEL_PATH}", "critic.model.enable_gradient_checkpointing=True",
    "critic.ppo_micro_batch_size_per_gpu={CRITIC_MICRO_BATCH_SIZE}", "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False", "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0",
    'trainer.logger=["console","wandb"]', "trainer.project_name='verl_example_gsm8k'",
    "trainer.experiment_name='deepseek_llm_7b_function_rm'", "trainer.n_gpus_per_node={N_GPUS}", "trainer.nnodes=1",
    "trainer.save_freq=20", "trainer.test_freq=1", "trainer.total_epochs={TOTAL_EPOCHS}",
    "trainer.default_local_dir={CKPTS_DIR}",
]

# python3 -m recipe.dapo.main_dapo (the script submits it with `ray job submit`).
DAPO_QWEN2_5_32B = [
    "data.train_files={TRAIN_FILE}", "data.val_files={TEST_FILE}", "data.prompt_key=prompt",
    "data.truncation='left'", "data.max_prompt_length={MAX_PROMPT_LENGTH}",
    "data.max_response_length={MAX_RESPONSE_LENGTH}", "data.gen_batch_size={GEN_BATCH_SIZE}",
    "data.train_batch_size={TRAIN_BATCH_SIZE}", "actor_rollout_ref.rollout.n={N}", "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False", "algorithm.kl_ctrl.kl_coef=0.0", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0", "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "algorithm.filter_groups.enable=True", "algorithm.filter_groups.max_num_gen_batches=10",
    "algorithm.filter_groups.metric=acc", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu={MAX_TOKENS}",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={MAX_TOKENS}",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={MAX_TOKENS}", "actor_rollout_ref.model.path={MODEL_PATH}",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10", "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH_SIZE}",
    "actor_rollout_ref.actor.fsdp_config.param_offload=True", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.grad_clip=1.0",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.ulysses_sequence_parallel_size={SP_SIZE}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.80", "actor_rollout_ref.rollout.tensor_model_parallel_size={TP}",
    "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    "actor_rollout_ref.rollout.max_num_batched_tokens={MAX_TOKENS}", "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.top_p=1.0", "actor_rollout_ref.rollout.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0", "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "actor_rollout_ref.rollout.val_kwargs.top_k=-1", "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
    "actor_rollout_ref.rollout.val_kwargs.n=1", "actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "actor_rollout_ref.ref.ulysses_sequence_parallel_size={SP_SIZE}",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1", "reward_model.reward_manager=dapo",
    "reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len={OVERLONG_BUFFER_LEN}",
    "reward_model.overlong_buffer.penalty_factor=1.0", 'trainer.logger=["console","wandb"]',
    "trainer.project_name=DAPO", "trainer.experiment_name=DAPO-Qwen2.5-32B", "trainer.n_gpus_per_node={N_GPUS}",
    "trainer.nnodes=1", "trainer.val_before_train=True", "trainer.test_freq=5", "trainer.save_freq=25",
    "trainer.total_epochs={TOTAL_EPOCHS}", "trainer.default_local_dir={CKPTS_DIR}", "trainer.resume_mode=auto",
]

# A GSPO run written for verl 0.9: its default rollout mode (async), an engine Quiver lacks (sglang), and keys of
# verl 0.9's schema that Quiver's tree does not have (rollout log-probs, a profiler, data.image_key), and the hermes
# tool format (read by the tool loop only).
GSPO_VERL_0_9 = [
    "algorithm.adv_estimator=grpo", "data.train_files={TRAIN_FILE}", "data.val_files={TEST_FILE}",
    "data.train_batch_size={TRAIN_BATCH_SIZE}", "data.max_prompt_length={MAX_PROMPT_LENGTH}",
    "data.max_response_length={MAX_RESPONSE_LENGTH}", "data.image_key=images", "data.return_raw_chat=True",
    "actor_rollout_ref.model.path={MODEL_PATH}", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    "actor_rollout_ref.actor.clip_ratio_low=0.0003", "actor_rollout_ref.actor.clip_ratio_high=0.0004",
    "actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH_SIZE}",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}",
    "actor_rollout_ref.actor.calculate_entropy=True", "actor_rollout_ref.rollout.name=sglang",
    "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.rollout.multi_turn.format=hermes", "actor_rollout_ref.rollout.n={N}",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}",
    "global_profiler.tool=nsys", "trainer.logger=['console']", "trainer.n_gpus_per_node={N_GPUS}",
    "trainer.nnodes=1", "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.total_epochs={TOTAL_EPOCHS}",
    "trainer.default_local_dir={CKPTS_DIR}",
]

# verl's GSM8K multi-turn tool example (examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh with its config
# gsm8k_multiturn_grpo.yaml and tool YAML gsm8k_tool_config.yaml; data from gsm8k_tool_agent_loop.py). The mode is
# left to verl 0.9's default.
GSM8K_MULTITURN = [
    "--config-path={CONFIG_PATH}", "--config-name=gsm8k_multiturn_grpo",
    "algorithm.adv_estimator=grpo", "data.train_batch_size={TRAIN_BATCH_SIZE}",
    "data.max_prompt_length={MAX_PROMPT_LENGTH}", "data.max_response_length={MAX_RESPONSE_LENGTH}",
    "data.filter_overlong_prompts=True", "data.truncation='error'", "data.return_raw_chat=True",
    "actor_rollout_ref.model.path={MODEL_PATH}", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH_SIZE}",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False", "global_profiler.tool=torch_memory",
    "global_profiler.save_path=./mem_snapshots",
    "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=100000",
    "global_profiler.global_tool_config.torch_memory.stack_depth=32",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}",
    "actor_rollout_ref.rollout.tensor_model_parallel_size={TP}", "actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.85", "actor_rollout_ref.rollout.multi_stage_wake_up=True",
    "actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO_BATCH_SIZE}",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "actor_rollout_ref.rollout.over_sample_rate=0.1",
    "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", "trainer.logger=['console','wandb']",
    "trainer.project_name='multi-turn-grpo-qwen2.5-3b-sglang'", "trainer.experiment_name={EXPERIMENT_NAME}",
    "trainer.n_gpus_per_node={N_GPUS}", "trainer.nnodes=1", "trainer.save_freq=-1", "trainer.test_freq=20",
    "trainer.val_before_train=True", "data.train_files={TRAIN_FILE}", "data.val_files={TEST_FILE}",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOL_CONFIG}", "trainer.total_epochs={TOTAL_EPOCHS}",
]

# Its Hydra config (examples/sglang_multiturn/config/gsm8k_multiturn_grpo.yaml): verl's ppo_trainer found through a
# search path relative to verl's checkout.
GSM8K_MULTITURN_CONFIG = """\
hydra:
  searchpath:
    - file://verl/trainer/config

defaults:
  - ppo_trainer
  - _self_

data:
  max_prompt_length: 1024
  max_response_length: 1024
  train_batch_size: 256
  return_raw_chat: True

actor_rollout_ref:
  hybrid_engine: True
  rollout:
    name: sglang
    multi_turn:
      enable: True
      max_assistant_turns: 5
"""

# Its tool YAML (the descriptions reworded): verl's GSM8K tool, by verl's class path.
GSM8K_TOOL_CONFIG = """\
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "Scores a GSM8K answer: 1.0 when it is right, else 0.0"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The answer, digits only"
          required: ["answer"]
"""

# verl's v1 trainer in colocate_async mode (trainer.use_v1 is verl 0.9's default): the GRPO example above with the
# keys verl's docs/advance/v1_async_trainer.md names. No script of the census sets them; this is how a user would.
GRPO_V1_COLOCATE_ASYNC = [
    *GRPO_QWEN2_7B, "trainer.use_v1=True", "trainer.v1.trainer_mode=colocate_async",
    "trainer.v1.colocate_async.num_warmup_batches=1", "trainer.v1.sampler.max_off_policy_threshold=4",
    "trainer.v1.sampler.max_off_policy_strategy=drop",
]

# The same in separate_async mode: rollout GPUs of their own (verl's actor_rollout_ref.rollout.nnodes x
# n_gpus_per_node) beside the training GPUs; a push every parameter_sync_step mini-batches (train = sync x mini).
GRPO_V1_SEPARATE_ASYNC = [
    *GRPO_QWEN2_7B, "trainer.use_v1=True", "trainer.v1.trainer_mode=separate_async",
    "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node={ROLLOUT_GPUS}",
    "trainer.v1.separate_async.num_warmup_batches=1", "trainer.v1.separate_async.parameter_sync_step={SYNC_STEP}",
    "trainer.v1.sampler.max_off_policy_threshold=4",
]

# The same example with the async_training keys of verl's fully-async recipe (docs/advance/fully_async.md).
GRPO_FULLY_ASYNC = [
    *GRPO_QWEN2_7B, "async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=4",
    "async_training.require_batches=1", "async_training.partial_rollout=True",
]
