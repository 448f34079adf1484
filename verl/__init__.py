"""Quiver: a verl-style RL trainer for reasoning LLMs that also runs end to end on CPU."""

__version__ = "0.1.0"
