"""Checkpoints on the GPU: a run killed after its step-2 checkpoint resumes with the metrics of the uninterrupted run,
and the merged model of the last checkpoint decodes greedily what the trainer decoded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gpu_suite import (
    GRPO_TINY_STEPS,
    REPO,
    grpo_tiny_overrides,
    launch,
    resume_step,
    suite_device,
    training_metrics,
)

pytestmark = pytest.mark.gpu

# On CPU a resumed run repeats the uninterrupted one exactly. CUDA kernels are not bitwise reproducible from one
# process to the next (atomic adds in the embedding backward, GEMM split choices) and the actor computes in bf16, so
# two uninterrupted runs already differ in the last bits; the resumed steps must agree to this tolerance.
RESUME_TOLERANCE = {"cpu": dict(rel=1e-6, abs=1e-7), "cuda": dict(rel=2e-2, abs=2e-3)}
# A greedy token may differ only where the merged model's two best logits (in float32) are closer than this, by the
# dtype the trainer's HF engine decoded in (the run plan's hf_engine_dtype): float32 rounding between a batched,
# KV-cached decode and a single uncached one is about 1e-6 here; a 16-bit engine rounds each logit by up to a few of
# its units in the last place (2^-7 at |z| = 2) through the layers.
NEAR_TIE = {"float32": 1e-4, "bfloat16": 0.1, "float16": 0.02}


def test_killed_run_resumes_with_the_uninterrupted_metrics(grpo_tiny_run, tiny_model_dir, arithmetic_data_dir,
                                                          tmp_path, figures):
    """The tiny GRPO run again, SIGKILLed (its whole process group: driver and Ray workers) as soon as global_step_2
    is committed, then started again with trainer.resume_mode=auto (the default): it resumes from its newest
    checkpoint, and every step it runs logs what the uninterrupted run (grpo_tiny_run) logged.

    Committed means named by the latest marker, which is written just after the step directory is renamed into
    place: auto resumes from no step past the marker's, so a kill between the two would resume from step 1."""
    from verl.utils.checkpoint.checkpoint_manager import LATEST_FILE

    run_dir = tmp_path / "run"

    def step_2_committed() -> bool:
        try:
            return int((run_dir / LATEST_FILE).read_text()) >= 2
        except (OSError, ValueError):  # not written yet, or caught mid-write
            return False

    overrides = grpo_tiny_overrides(tiny_model_dir, arithmetic_data_dir, run_dir)
    killed = launch("killed", overrides, tmp_path, stop_when=step_2_committed)
    assert killed.killed, f"the run ended (exit {killed.returncode}) before its step-2 checkpoint appeared"
    resumed = launch("resumed", overrides, tmp_path)
    start = resume_step(resumed.output)
    figures.update(resumed.figures(), resumed_from_step=start)
    assert start is not None and 2 <= start < GRPO_TINY_STEPS, f"resumed from {start}:\n{resumed.output[-3000:]}"

    straight = {r["step"]: training_metrics(r) for r in grpo_tiny_run.steps}
    after_kill = {r["step"]: training_metrics(r) for r in resumed.steps}
    assert sorted(after_kill) == list(range(1, GRPO_TINY_STEPS + 1))  # the killed run's steps, then the resumed ones
    for step in range(start + 1, GRPO_TINY_STEPS + 1):
        assert after_kill[step] == pytest.approx(straight[step], **RESUME_TOLERANCE[suite_device()]), step
    assert straight[3]["actor/pg_loss"] != straight[4]["actor/pg_loss"], "the compared steps really differ"


def _greedy(model, prompt_ids: list[int], max_tokens: int, eos_ids: set[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens of one prompt, one full forward pass per token, and at each the gap between the two best
    logits."""
    import torch

    tokens, gaps = [], []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([prompt_ids + tokens], device=model.device)).logits[0, -1].float()
            best = torch.topk(logits, 2)
            tokens.append(int(best.indices[0]))
            gaps.append(float(best.values[0] - best.values[1]))
            if tokens[-1] in eos_ids:
                break
    return tokens, gaps


def _first_divergence(tokenizer, tokens: list[int], text: str) -> int:
    """The first token after which the decoded tokens stop being a prefix of `text` (a token that ends inside a
    multi-byte character is decided by the next one)."""
    for k in range(len(tokens)):
        decoded = tokenizer.decode(tokens[: k + 1], skip_special_tokens=True)
        if not decoded.endswith("\ufffd") and not text.startswith(decoded):
            return k
    return len(tokens) - 1  # the whole decode is a prefix: the trainer's response goes on past it


def test_merged_model_greedy_equals_the_trainers(grpo_tiny_run, tmp_path, figures):
    """`python -m verl.model_merger merge` of the last checkpoint, then each validation prompt decoded greedily by the
    merged Hugging Face model, against the trainer's own greedy responses at that step (the validation dump:
    rollout.val_kwargs has do_sample=false; the validation after the last update, whose weights that checkpoint
    holds).

    The merger writes the float32 shards, and this test decodes them in float32 on the suite's device; the trainer's
    HF engine decoded in its plan's dtype (float32 on CPU, rollout.dtype, bf16, on CUDA) a left-padded batch with a
    KV cache, this test one prompt at a time without. That can only flip an argmax between two logits closer than
    the engine's rounding: a response may differ only where the merged model's best two logits at the first
    differing token are within NEAR_TIE of the engine's dtype, and no more than one response in eight may.
    """
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.dataset.rl_dataset import RLHFDataset

    run_dir = grpo_tiny_run.run_dir
    merged_dir = tmp_path / "merged"
    subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir",
                    str(run_dir / f"global_step_{GRPO_TINY_STEPS}" / "actor"), "--target_dir", str(merged_dir)],
                   check=True, cwd=REPO)
    dump_path = run_dir.parent / "validation" / f"{GRPO_TINY_STEPS}.jsonl"
    trainer_rows = [json.loads(line) for line in dump_path.read_text().splitlines()]

    config = OmegaConf.load(run_dir / "config.yaml")  # the run's resolved config
    near_tie = NEAR_TIE[json.loads((run_dir / "run_plan.json").read_text())["rollout"]["hf_engine_dtype"]]
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    prompts = RLHFDataset(config.data.val_files, tokenizer, config.data)
    assert len(prompts) == len(trainer_rows) and config.actor_rollout_ref.rollout.val_kwargs.n == 1
    model = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).to(suite_device()).eval()
    eos = model.generation_config.eos_token_id  # the engine stops at the tokenizer's and the generation config's
    eos_ids = {tokenizer.eos_token_id, *([eos] if isinstance(eos, int) else eos or [])}

    exact, near_ties, differing = 0, [], []
    for i, row in enumerate(trainer_rows):
        prompt_ids = list(map(int, prompts[i]["raw_prompt_ids"]))
        assert tokenizer.decode(prompt_ids, skip_special_tokens=True) == row["input"], f"prompt {i} out of order"
        tokens, gaps = _greedy(model, prompt_ids, config.data.max_response_length, eos_ids)
        if tokenizer.decode(tokens, skip_special_tokens=True) == row["output"]:
            exact += 1
            continue
        k = _first_divergence(tokenizer, tokens, row["output"])
        (near_ties if gaps[k] < near_tie else differing).append((i, k, gaps[k]))
    figures.update(prompts=len(trainer_rows), exact=exact, near_ties=len(near_ties))
    assert not differing, f"(prompt, token, logit gap) where the merged model decodes otherwise: {differing[:5]}"
    assert len(near_ties) <= len(trainer_rows) // 8, f"too many near ties: {near_ties}"
