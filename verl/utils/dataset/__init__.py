"""Datasets in verl's parquet row schema: the RL prompt dataset and the synthetic arithmetic task."""


def __getattr__(name: str):
    # verl's `from verl.utils.dataset import RLHFDataset`, imported on first use (it pulls in torch and torchdata).
    if name == "RLHFDataset":
        from verl.utils.dataset.rl_dataset import RLHFDataset

        return RLHFDataset
    raise AttributeError(f"module 'verl.utils.dataset' has no attribute {name!r}")
