"""verl's sampler bases for `data.sampler.class_path` / `class_name`: the face of verl/utils/dataset/rl_dataset.py,
where the sampler is built and its update(batch) found."""

from verl.utils.dataset.rl_dataset import AbstractCurriculumSampler, AbstractSampler

__all__ = ["AbstractCurriculumSampler", "AbstractSampler"]
