"""On-policy distillation in the trainer (verl/trainer/ppo/distillation.py): the plan of `distillation.*`, its refusals,
the routing of rows to teachers and the tokenizer check."""

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.config import load_config
from verl.trainer.ppo.distillation import check_teacher_tokenizers, plan_distillation, route_to_teachers, teacher_rows
from verl.utils.config import ConfigError
from verl.utils.run_plan import TEACHER_INDEX


def distillation_config(tmp_path, *extra):
    teacher = tmp_path / "teacher"
    teacher.mkdir(exist_ok=True)
    return load_config(overrides=["distillation.enabled=true",
                                  f"distillation.teacher_models.teacher_model.model_path={teacher}", *extra])


def test_disabled_by_default_and_planned_with_verl_defaults(tmp_path):
    assert plan_distillation(load_config()) is None
    plan = plan_distillation(distillation_config(tmp_path))
    (teacher,) = plan.teachers
    assert (teacher.name, teacher.key, teacher.engine) == ("teacher_model", None, "fsdp")
    assert teacher.temperature == 1.0  # null: the rollout temperature
    assert (plan.loss_mode, plan.topk, plan.use_policy_gradient, plan.use_task_rewards) == ("k3", None, False, True)
    assert plan.distillation_loss_coef == 1.0 and plan.teacher_key == "data_source"


def test_topk_and_policy_gradient_settings_carry_over(tmp_path):
    plan = plan_distillation(distillation_config(
        tmp_path, "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=4",
        "distillation.distillation_loss.use_policy_gradient=true", "distillation.distillation_loss.clip_ratio_high=0.3",
        "distillation.teacher_models.teacher_model.inference.temperature=0.7"))
    assert (plan.topk, plan.uses_topk, plan.use_policy_gradient, plan.clip_ratio_high) == (4, True, True, 0.3)
    assert plan.teachers[0].temperature == 0.7


def test_a_teacher_per_key(tmp_path):
    (tmp_path / "math").mkdir()
    plan = plan_distillation(distillation_config(
        tmp_path, f"+distillation.teacher_models.math_teacher.model_path={tmp_path / 'math'}",
        "+distillation.teacher_models.math_teacher.key=math"))
    assert [(t.name, t.key) for t in plan.teachers] == [("teacher_model", None), ("math_teacher", "math")]
    rows = {"data_source": np.array(["math", "code", "math"], dtype=object)}
    assert teacher_rows(rows, plan).tolist() == [1, 0, 1]
    batch = route_to_teachers(DataProto.from_dict(tensors={"x": torch.zeros(3)}, non_tensors=rows), plan)
    assert batch.batch[TEACHER_INDEX].tolist() == [1, 0, 1] and batch.meta_info["teachers"] == [0, 1]


def test_a_row_without_a_teacher_is_an_error_naming_its_value(tmp_path):
    plan = plan_distillation(distillation_config(tmp_path, "distillation.teacher_models.teacher_model.key=math"))
    with pytest.raises(ValueError, match="data_source='code' has no teacher"):
        teacher_rows({"data_source": np.array(["math", "code"], dtype=object)}, plan)
    with pytest.raises(ValueError, match="distillation.teacher_key='data_source' is not a column"):
        teacher_rows({"ability": np.array(["math"], dtype=object)}, plan)


@pytest.mark.parametrize("override, message", [
    ("distillation.teacher_models.teacher_model.model_path=null", "teacher_model.model_path is not set"),
    ("distillation.nnodes=1", "distillation.nnodes=1: a teacher pool of its own is not built"),
    ("distillation.teacher_models.teacher_model.num_replicas=2", "num_replicas=2: teacher servers"),
    ("distillation.teacher_models.teacher_model.inference.name=sglang", "inference.name='sglang': a teacher is "
     "served by an FSDP forward on the actor's ranks .* or by one of the rollout engines hf, vllm"),
    ("distillation.teacher_models.teacher_model.inference.name=vllm "
     "distillation.teacher_models.teacher_model.inference.temperature=0.7",
     "inference.name=vllm at temperature 0.7 .*temperature 1 only"),
    ("distillation.distillation_loss.loss_mode=k1", "loss_mode=k1 with use_policy_gradient=false"),
])
def test_refusals_name_the_key(tmp_path, override, message):
    cfg = distillation_config(tmp_path, *override.split())
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        plan_distillation(cfg)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_rollout_engine_serves_the_teacher_with_its_inference_settings(tmp_path, engine):
    plan = plan_distillation(distillation_config(
        tmp_path, f"distillation.teacher_models.teacher_model.inference.name={engine}",
        "distillation.teacher_models.teacher_model.inference.gpu_memory_utilization=0.3"))
    (teacher,) = plan.teachers
    assert teacher.engine == engine and ("gpu_memory_utilization", 0.3) in teacher.engine_settings
    assert dict(teacher.engine_settings).get("enforce_eager") is True  # the section's default, kept
    assert plan_distillation(distillation_config(tmp_path)).teachers[0].engine_settings == ()  # fsdp: none


def test_topk_refuses_sequence_parallelism_and_a_missing_folder(tmp_path):
    assert plan_distillation(distillation_config(tmp_path), sequence_parallel=2) is not None  # k3: log-probs only
    cfg = distillation_config(tmp_path, "distillation.distillation_loss.loss_mode=forward_kl_topk")
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size=2: the top-k loss reads whole rows"):
        plan_distillation(cfg, sequence_parallel=2)
    cfg = load_config(overrides=["distillation.enabled=true",
                                 f"distillation.teacher_models.teacher_model.model_path={tmp_path / 'none'}"])
    with pytest.raises(ConfigError, match="no such folder"):
        plan_distillation(cfg)


def test_two_catch_all_teachers_are_refused(tmp_path):
    cfg = distillation_config(tmp_path, f"+distillation.teacher_models.other.model_path={tmp_path / 'teacher'}")
    with pytest.raises(ConfigError, match="teacher_model, other all have key=null"):
        plan_distillation(cfg)


def test_the_teachers_tokenizer_must_be_the_students(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from verl.demo.tiny_model import build_tiny_model

    student = AutoTokenizer.from_pretrained(tiny_model_dir)
    same = plan_distillation(load_config(overrides=[
        "distillation.enabled=true", f"distillation.teacher_models.teacher_model.model_path={tiny_model_dir}"]))
    check_teacher_tokenizers(same, student)
    other = build_tiny_model(str(tmp_path / "other"), seed=1, tokenizer_vocab_size=200)
    plan = plan_distillation(load_config(overrides=[
        "distillation.enabled=true", f"distillation.teacher_models.teacher_model.model_path={other}"]))
    with pytest.raises(ConfigError, match=r"teacher_model.model_path=.*its tokenizer is not the student's"):
        check_teacher_tokenizers(plan, student)
