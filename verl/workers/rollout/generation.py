"""How a rank turns a batch of prompts into its rollout batch: one protocol, one implementation per way of generating.

    generator = build_generator(engine, tokenizer, config, rank, mode)
    output = generator.generate(prompts, params, n, validate)   # n rows per prompt, adjacent; rollout batch keys

- `PlainSampling` (mode `plain`, rollout.mode=sync): the engine samples n completions of every prompt
  (`layout.generate_sequences`).
- `ToolRounds` (mode `tool_rounds`, rollout.mode=sync_with_tool): the seeds' round-based tool loop with ARPO's and
  AEPO's branching (`tool_rounds.ToolRoundLoop`); a prompt's n trajectories are made together.
- `AgentLoops` (mode `agent_loops`, rollout.mode=async): verl's per-sample agent loops (`agent_loops.AgentLoopManager`),
  each prompt's n loops independent, or branching from one another with ARPO's beam.

`validate` samples without branching (validation and offline evaluation). Which way a run generates is decided once,
by `modes.generation_mode` (the run plan's `rollout.generation`, or offline generation's rollout config); the
worker and `main_generation` build their generator with `build_generator`. A new way of generating is one class here
and one line in `build_generator`.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Protocol

from verl.protocol import DataProto
from verl.workers.rollout.base import RolloutEngine, SamplingParams
from verl.workers.rollout.layout import generate_sequences
from verl.workers.rollout.modes import GENERATION_MODES


class Generator(Protocol):
    def generate(self, prompts: DataProto, params: SamplingParams, n: int, validate: bool) -> DataProto:
        """n responses per row of `prompts` (left-padded ids and the data's columns), adjacent, as the rollout batch
        (docs/internal_contracts.md); the call's metrics in `meta_info["metrics"]`."""

    def close(self) -> None:
        """Stop what the generator started (the tools' worker pools)."""


def pad_id(tokenizer) -> int:
    """The id responses and re-rendered prompts are padded with: the tokenizer's pad token, else its EOS (as the
    prompt data set pads)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


class PlainSampling:
    def __init__(self, engine: RolloutEngine, tokenizer, response_length: int):
        self.engine, self.tokenizer, self.response_length = engine, tokenizer, response_length

    def generate(self, prompts: DataProto, params: SamplingParams, n: int, validate: bool) -> DataProto:
        return generate_sequences(self.engine, prompts, replace(params, n=n), response_length=self.response_length,
                                  pad_token_id=pad_id(self.tokenizer), eos_token_id=self.tokenizer.eos_token_id)

    def close(self) -> None:
        pass


class ToolRounds:
    def __init__(self, engine: RolloutEngine, tokenizer, rollout_config: Any, rank: int):
        from verl.workers.rollout.tool_rounds import build_tool_round_loop

        self.loop = build_tool_round_loop(engine, tokenizer, rollout_config, rank)
        self.tokenizer, self.response_length = tokenizer, int(rollout_config.response_length)

    def generate(self, prompts: DataProto, params: SamplingParams, n: int, validate: bool) -> DataProto:
        # A shallow copy per call: what a call sets on the loop (branching on or off, its draws) stays its own when
        # calls run at once (generation ahead of the update, rollout_stream.py); engine, tools and RNG are shared.
        loop = copy.copy(self.loop)
        return loop.generate_sequences(prompts, n=n, params=params, response_length=self.response_length,
                                       pad_token_id=pad_id(self.tokenizer), branching=not validate)

    def close(self) -> None:
        if self.loop.tools is not None:
            self.loop.tools.close()


class AgentLoops:
    def __init__(self, engine: RolloutEngine, tokenizer, config: Any, rank: int):
        from verl.workers.rollout.agent_loops import build_agent_loop_manager

        self.manager = build_agent_loop_manager(engine, tokenizer, config, rank)
        self.tokenizer, self.response_length = tokenizer, int(config.rollout.response_length)

    def generate(self, prompts: DataProto, params: SamplingParams, n: int, validate: bool) -> DataProto:
        return self.manager.generate_sequences(prompts, params, response_length=self.response_length,
                                               pad_token_id=pad_id(self.tokenizer), n=n, branching=not validate)

    def close(self) -> None:
        pass


def build_generator(engine: RolloutEngine, tokenizer, config: Any, rank: int, mode: str) -> Generator:
    """The generator of `mode` over `engine`. `config` holds the rollout section as `config.rollout` (the worker's
    `actor_rollout_ref` section, or offline generation's config)."""
    if mode == "plain":
        return PlainSampling(engine, tokenizer, int(config.rollout.response_length))
    if mode == "tool_rounds":
        return ToolRounds(engine, tokenizer, config.rollout, rank)
    if mode == "agent_loops":
        return AgentLoops(engine, tokenizer, config, rank)
    raise ValueError(f"generation mode {mode!r} is not one of {', '.join(GENERATION_MODES)}")
