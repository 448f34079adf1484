"""Shared set-up of the end-to-end tests: the tiny-run overrides and a trainer built the way main_ppo builds it."""

import os

from verl.trainer.config import load_config
from verl.trainer.main_ppo import plan_ppo_run
from verl.trainer.ppo.config_rules import validate_ppo_config
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.reward import load_reward_manager
from verl.utils.dataset.rl_dataset import RLHFDataset

DIGIT_REWARD = os.path.join(os.path.dirname(__file__), "digit_reward.py")


def tiny_overrides(model_dir, data_dir, *extra):
    """3 GRPO steps of 8 prompts x 4 samples x 16 tokens on 2 CPU ranks, rewarded by the dense digit reward."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=8",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.n_gpus_per_node=2",
        "trainer.device=cpu",
        "trainer.total_training_steps=3",
        "trainer.val_before_train=false",
        f"custom_reward_function.path={DIGIT_REWARD}",
        *extra,
    ]


def build_trainer(overrides, model_dir, reward_server=None):
    """A RayPPOTrainer with its workers started (the caller shuts it down); `reward_server`: the served generative
    reward model (verl/utils/model_server.Server) whose address the reward function gets, as main_ppo passes it."""
    from transformers import AutoTokenizer

    cfg = load_config(overrides=overrides)
    validate_ppo_config(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train = RLHFDataset(cfg.data.train_files, tokenizer, cfg.data)
    val = RLHFDataset(cfg.data.val_files, tokenizer, cfg.data)
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0, reward_server=reward_server)
    val_reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0, is_eval=True, reward_server=reward_server)
    plan, _ = plan_ppo_run(cfg, "cpu")
    trainer = RayPPOTrainer(cfg, tokenizer, train, val, reward_fn, val_reward_fn, plan=plan)
    trainer.init_workers()
    return trainer


def prime_model(model_dir, out_dir, conversations, steps=150, lr=3e-3, seed=0, tools=None):
    """A copy of the model at `model_dir` fitted for a few steps to `conversations` ([(prompt text or chat messages,
    response)], chat templated, with `tools`' schemas where given, loss on every token): a seconds-long cold start
    that makes the tiny model follow a format (call a tool, answer in tags) so that tool rounds and branching happen
    in the end-to-end runs. Saved to `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="right")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}] if isinstance(p, str) else list(p),
                                           tools=tools, tokenize=False, add_generation_prompt=True)
             + r + tokenizer.eos_token
             for p, r in conversations]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        rows = torch.randint(len(texts), (min(16, len(texts)),))
        loss = model(input_ids=batch["input_ids"][rows], attention_mask=batch["attention_mask"][rows],
                     labels=labels[rows]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return loss.item()


def fit_keeping_batches(trainer):
    """Fit and shut down a built trainer: (history, the batch each step trained on), for checks on real batches."""
    batches = []
    original = trainer._step

    def step(*args, **kwargs):
        batch = original(*args, **kwargs)
        batches.append(batch)
        return batch

    trainer._step = step
    try:
        history = trainer.fit()
    finally:
        trainer.shutdown()
    return history, batches


def fit_trainer(overrides, model_dir, probe_step=False):
    """Build, fit and shut down a trainer: (trainer, history, weight fingerprints before and after, and with
    `probe_step` the batch of one more step after training, for checks on a real batch; else None)."""
    trainer = build_trainer(overrides, model_dir)
    try:
        trainer.rollout_info = trainer.generation_wg.rollout_info()  # per generating rank: engine class, TP place
        before = trainer.actor_rollout_wg.weight_fingerprint()
        history = trainer.fit()
        after = trainer.actor_rollout_wg.weight_fingerprint()
        if trainer.separate_rollout is not None:  # the rollout ranks' own weights, and the actor's, at the end
            trainer.actor_rollout_wg_fingerprint = after
            trainer.rollout_fingerprint = trainer.separate_rollout.weight_fingerprint()
        batch = trainer._step(trainer._prompt_batches(), {}, {}) if probe_step else None
    finally:
        trainer.shutdown()
    return trainer, history, before, after, batch
