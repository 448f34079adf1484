"""verl's `verl.utils.dataset.multiturn_sft_dataset.MultiTurnSFTDataset`: Quiver's SFTDataset (sft_dataset.py),
which reads the `messages` rows of verl's multi-turn SFT data (and prompt/response and ShareGPT rows)."""

from verl.utils.dataset.sft_dataset import SFTDataset as MultiTurnSFTDataset

__all__ = ["MultiTurnSFTDataset"]
