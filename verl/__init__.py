"""Quiver: a verl-style RL trainer for reasoning LLMs that also runs end to end on CPU."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # verl's `from verl import DataProto`, imported on first use so that `import verl.utils...` stays light.
    if name == "DataProto":
        from verl.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'verl' has no attribute {name!r}")
