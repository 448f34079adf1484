"""On-policy distillation in the trainer (`distillation.*`): the plan of the teachers and the loss, the routing of each
row to its teacher, and the checks made before Ray starts. The losses are verl/algorithms/distillation.py's; the
teachers' forward passes are the workers' (`ActorRolloutRefWorker.compute_teacher_log_prob`).

A step with distillation: rollout -> reward -> old log-probs -> (reference) -> teacher log-probs of every response
token (`teacher_log_probs`, and with forward_kl_topk the teacher's top-k `teacher_topk_log_probs`/`teacher_topk_ids`)
-> advantage -> the actor update, whose loss adds the distillation term.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from omegaconf import DictConfig

from verl.algorithms.distillation import TOPK_MODES, check_loss_settings
from verl.utils.config import ConfigError
from verl.utils.run_plan import TEACHER_INDEX, DistillationPlan, TeacherPlan

SECTION = "distillation"
# What can serve a teacher: a frozen FSDP forward on the actor's ranks (null / fsdp), or a rollout engine replicated
# on each of them that scores prompt + response (`RolloutEngine.score`).
TEACHER_ENGINES = ("fsdp", "hf", "vllm")
# The teacher's inference.* keys that set the engine's rollout settings of the same name.
ENGINE_SETTINGS = ("dtype", "gpu_memory_utilization", "tensor_model_parallel_size", "max_model_len", "enforce_eager")


def plan_distillation(config: DictConfig, sequence_parallel: int = 1) -> DistillationPlan | None:
    """The DistillationPlan of `config.distillation` (None when it is not enabled) for a run whose actor runs over
    Ulysses groups of `sequence_parallel` ranks (the topology's); every problem of the section in one ConfigError,
    each line naming its key."""
    section = config.get(SECTION)
    if section is None or not section.enabled:
        return None
    loss = section.distillation_loss
    problems = check_loss_settings(loss)
    if int(section.nnodes) > 0:
        problems.append(f"{SECTION}.nnodes={section.nnodes}: a teacher pool of its own is not built in Quiver; the "
                        f"teachers run on the actor's ranks (set {SECTION}.nnodes=0)")
    teachers, catch_all = [], []
    rollout_temperature = float(config.actor_rollout_ref.rollout.temperature)
    for name, teacher in (section.teacher_models or {}).items():
        where = f"{SECTION}.teacher_models.{name}"
        if teacher.get("model_path") is None:
            problems.append(f"{where}.model_path is not set: name the teacher's HF model folder")
            continue
        path = os.path.expanduser(str(teacher.model_path))
        if not os.path.exists(path):
            problems.append(f"{where}.model_path={teacher.model_path}: no such folder (models are not downloaded "
                            "at run time; give a local HF model folder)")
        if int(teacher.get("num_replicas") or 0) > 0:
            problems.append(f"{where}.num_replicas={teacher.num_replicas}: teacher servers of their own are not "
                            "built in Quiver; the actor's ranks serve the teacher (set it to 0)")
        inference = teacher.get("inference") or {}
        engine = inference.get("name") or "fsdp"
        if engine not in TEACHER_ENGINES:
            problems.append(f"{where}.inference.name={engine!r}: a teacher is served by an FSDP forward on the "
                            f"actor's ranks (null or fsdp) or by one of the rollout engines {', '.join(TEACHER_ENGINES[1:])}")
        temperature = inference.get("temperature")
        at = rollout_temperature if temperature is None else float(temperature)
        if engine == "vllm" and at != 1.0:
            problems.append(f"{where}.inference.name=vllm at temperature {at} (inference.temperature, or the "
                            "rollout's): vLLM's prompt log-probs are the raw logits', temperature 1 only; serve the "
                            "teacher with inference.name=hf or null")
        settings = tuple((key, inference.get(key)) for key in ENGINE_SETTINGS
                         if engine != "fsdp" and inference.get(key) is not None)
        key = teacher.get("key")
        if key is None:
            catch_all.append(name)
        teachers.append(TeacherPlan(name=str(name), model_path=path, key=None if key is None else str(key),
                                    engine=engine, temperature=at, engine_settings=settings))
    if not teachers and not problems:
        problems.append(f"{SECTION}.enabled=true but {SECTION}.teacher_models names no teacher")
    if len(catch_all) > 1:
        problems.append(f"{SECTION}.teacher_models: {', '.join(catch_all)} all have key=null; at most one teacher "
                        f"takes the rows no other claims (give the others .key=<a {section.teacher_key} value>)")
    keys = [t.key for t in teachers if t.key is not None]
    if len(keys) != len(set(keys)):
        problems.append(f"{SECTION}.teacher_models: two teachers have the same key ({sorted(keys)})")
    if loss.loss_mode in TOPK_MODES and sequence_parallel > 1:
        problems.append(f"{SECTION}.distillation_loss.loss_mode={loss.loss_mode} with actor_rollout_ref.actor."
                        f"ulysses_sequence_parallel_size={sequence_parallel}: the top-k loss reads whole rows' logits, which sequence "
                        "parallelism splits; use an estimator loss_mode (k3) or SP=1")
    if problems:
        raise ConfigError("\n".join(problems))
    topk = int(loss.topk) if loss.loss_mode in TOPK_MODES else None
    clip = float(loss.clip_ratio)
    return DistillationPlan(
        teachers=tuple(teachers), teacher_key=str(section.teacher_key), loss_mode=str(loss.loss_mode), topk=topk,
        use_policy_gradient=bool(loss.use_policy_gradient), use_task_rewards=bool(loss.use_task_rewards),
        distillation_loss_coef=float(loss.distillation_loss_coef),
        loss_max_clamp=None if loss.loss_max_clamp is None else float(loss.loss_max_clamp),
        log_prob_min_clamp=None if loss.log_prob_min_clamp is None else float(loss.log_prob_min_clamp),
        clip_ratio_low=clip if loss.clip_ratio_low is None else float(loss.clip_ratio_low),
        clip_ratio_high=clip if loss.clip_ratio_high is None else float(loss.clip_ratio_high))


def teacher_rows(non_tensor_batch: dict, plan: DistillationPlan) -> torch.Tensor:
    """`(bs,)` the index into plan.teachers of the teacher that scores each row: the one whose key is the row's
    teacher_key value, else the one with key null. A row no teacher takes is an error naming the value."""
    by_key = {t.key: i for i, t in enumerate(plan.teachers) if t.key is not None}
    fallback = next((i for i, t in enumerate(plan.teachers) if t.key is None), None)
    if not by_key:  # one teacher for every row: the column need not exist
        return torch.zeros(_rows(non_tensor_batch), dtype=torch.long)
    if plan.teacher_key not in non_tensor_batch:
        raise ValueError(f"distillation.teacher_key={plan.teacher_key!r} is not a column of the batch; the teachers' "
                         f"keys ({sorted(by_key)}) are values of it")
    values = np.asarray(non_tensor_batch[plan.teacher_key])
    index = []
    for value in values:
        chosen = by_key.get(str(value), fallback)
        if chosen is None:
            raise ValueError(f"a row with {plan.teacher_key}={value!r} has no teacher: the teachers' keys are "
                             f"{sorted(by_key)}; add a teacher with that key or one with key=null for the rest")
        index.append(chosen)
    return torch.tensor(index, dtype=torch.long)


def route_to_teachers(batch, plan: DistillationPlan):
    """`batch` (a DataProto) with its rows' teachers: the `teacher_index` column (`teacher_rows`) and, in meta_info,
    `teachers`: the indices some row needs (every rank runs those teachers' forward passes, and only those)."""
    index = teacher_rows(batch.non_tensor_batch, plan)
    if len(index) != len(batch):
        index = torch.zeros(len(batch), dtype=torch.long)  # a batch without non-tensor columns: one teacher
    batch.batch[TEACHER_INDEX] = index
    batch.meta_info["teachers"] = sorted(set(index.tolist()))
    return batch


def _rows(non_tensor_batch: dict) -> int:
    return len(next(iter(non_tensor_batch.values()))) if non_tensor_batch else 0


def check_teacher_tokenizers(plan: DistillationPlan | None, student_tokenizer) -> None:
    """Each teacher's tokenizer must be the student's: the teacher scores the student's token ids. A ConfigError
    naming the teacher's key and how the vocabularies differ otherwise."""
    if plan is None:
        return
    from transformers import AutoTokenizer

    student = student_tokenizer.get_vocab()
    problems = []
    for teacher in plan.teachers:
        where = f"{SECTION}.teacher_models.{teacher.name}.model_path={teacher.model_path}"
        try:
            tokenizer = AutoTokenizer.from_pretrained(teacher.model_path)
        except (OSError, ValueError) as err:
            problems.append(f"{where}: its tokenizer could not be read ({err})")
            continue
        vocab = tokenizer.get_vocab()
        if vocab != student:
            differ = sum(1 for token, i in vocab.items() if student.get(token) != i)
            problems.append(f"{where}: its tokenizer is not the student's ({len(vocab)} tokens against "
                            f"{len(student)}, {differ} of the teacher's map to another id); on-policy distillation "
                            "scores the student's token ids with the teacher, so both must share one tokenizer")
    if problems:
        raise ConfigError("\n".join(problems))
