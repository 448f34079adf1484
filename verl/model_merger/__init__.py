"""Turn a training checkpoint into a HuggingFace model: `python -m verl.model_merger merge --backend fsdp ...`."""

from verl.model_merger.fsdp_model_merger import CheckpointError, compare_with_hf, merge_checkpoint, merged_model

__all__ = ["CheckpointError", "compare_with_hf", "merge_checkpoint", "merged_model"]
