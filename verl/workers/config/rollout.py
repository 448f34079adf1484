"""The typed rollout section: the engine, sampling, agent-loop (ARPO/AEPO branching) and tool keys.

`RolloutConfig` holds the keys of the shared group `verl/trainer/config/rollout/rollout.yaml` (training's
`actor_rollout_ref.rollout` and generation's `rollout`); `PPORolloutConfig` adds what only training reads. The
defaults are the YAML's (`verl/utils/typed_config.py`); each class checks its own rules.
"""

from __future__ import annotations

import os
from typing import Any

from verl.utils.config import need
from verl.utils.typed_config import Section, config_section

ROLLOUT = "actor_rollout_ref.rollout"
ENTROPY_MODES = ("topk", "exact")
BRANCH_RULES = ("arpo", "aepo")
# async: verl 0.9's mode (its only one): the per-sample agent loops of verl/workers/rollout/agent_loops.py.
ROLLOUT_MODES = ("sync", "sync_with_tool", "async")
# verl's multi_turn.max_tool_response_length default: the characters of a tool result that mode=async's loops keep.
VERL_TOOL_RESPONSE_CHARS = 256


def tool_result_limit(rollout: Any, verl_loop: bool) -> int | None:
    """The characters a tool result keeps (`multi_turn.max_tool_response_length`); null means verl's 256 in verl's
    agent loops (`verl_loop`: mode=async's tool_agent) and no limit in the seeds' loop (mode=sync_with_tool), whose
    reference cuts none."""
    limit = (rollout.get("multi_turn") or {}).get("max_tool_response_length")
    return VERL_TOOL_RESPONSE_CHARS if limit is None and verl_loop else limit


def branch_seed(seed: int | None, rank: int) -> int | None:
    """The seed of one rank's ARPO/AEPO branching draws, in either tool loop: `rollout.seed` moved by the rank, so
    that ranks draw differently; None (an unseeded run) stays None."""
    return None if seed is None else seed + 1_000_003 * rank


@config_section(ROLLOUT)
class BranchingConfig(Section):
    """The ARPO / AEPO knobs (formulas in verl/workers/rollout/branching.py). initial_rollouts None = rollout.n."""

    initial_rollouts: int | None
    beam_size: float  # branch attempts per trajectory and tool round, plus one; an integer (the reference writes 1.)
    branch_probability: float
    entropy_weight: float
    branch_rule: str
    branch_penalty: float
    entropy_mode: str
    entropy_window: int
    entropy_top_k: int
    enable_dynamic_rollouts: bool
    initial_entropy_tokens: int
    dynamic_rollout_beta: float

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        if isinstance(self.beam_size, float):
            if not self.beam_size.is_integer():
                problems.append(f"{p}.beam_size={self.beam_size} must be an integer")
                return
            self.beam_size = int(self.beam_size)
        need(self.beam_size >= 1, f"{p}.beam_size={self.beam_size} must be >= 1", problems)
        need(0 <= self.branch_probability <= 1, f"{p}.branch_probability={self.branch_probability} must be in [0, 1]",
             problems)
        need(self.branch_rule in BRANCH_RULES, f"{p}.branch_rule={self.branch_rule!r} must be one of {BRANCH_RULES}",
             problems)
        need(self.branch_penalty >= 0, f"{p}.branch_penalty={self.branch_penalty} must be >= 0", problems)
        need(self.entropy_mode in ENTROPY_MODES,
             f"{p}.entropy_mode={self.entropy_mode!r} must be one of {ENTROPY_MODES}", problems)
        for key in ("entropy_window", "entropy_top_k", "initial_entropy_tokens"):
            need(getattr(self, key) >= 1, f"{p}.{key}={getattr(self, key)} must be >= 1", problems)
        need(self.initial_rollouts is None or self.initial_rollouts >= 1,
             f"{p}.initial_rollouts={self.initial_rollouts} must be >= 1", problems)

    @classmethod
    def from_rollout_config(cls, rollout: Any) -> BranchingConfig:
        """The branching knobs of a rollout node (the agent loop's view of it)."""
        return cls(**{key: rollout.get(key) for key in cls.__dataclass_fields__ if key in rollout})


@config_section(f"{ROLLOUT}.tools")
class ToolsConfig(Section):
    """`rollout.tools`: a tool YAML (config_path, whose keys these inline keys override) and tool_instances."""

    config_path: str | None
    call_limit: int
    max_workers: int
    timeout: float
    retry_count: int
    verbose_logging: bool
    fail_on_error: bool  # a tool that cannot be loaded: a config error before Ray starts (true) or skipped, warned
    tool_instances: dict[str, Any]

    def check(self, problems: list[str]) -> None:
        from verl.workers.tools.manager import load_tool_config

        try:  # the tool settings' own rules, with the tool YAML of config_path read in
            load_tool_config({key: getattr(self, key) for key in self.__dataclass_fields__})
        except ValueError as err:
            problems.append(str(err))


@config_section(f"{ROLLOUT}.multi_turn")
class MultiTurnConfig(Section):
    enable: bool  # true = mode sync_with_tool
    format: str | None  # null = the seeds' tags, or hermes / qwen (verl/workers/rollout/tool_formats.py)
    max_assistant_turns: int | None
    max_tool_response_length: int | None
    tool_response_truncate_side: str
    max_user_turns: int | None
    max_parallel_calls: int
    tool_config_path: str | None  # mode=async: verl's tool YAML
    function_tool_path: str | None  # mode=async: a Python file of @function_tool functions

    def check(self, problems: list[str]) -> None:
        from verl.workers.rollout.tool_formats import TRUNCATE_SIDES, format_problem

        super().check(problems)
        p = self.__config_prefix__
        problem = format_problem(self.format)
        need(problem is None, problem, problems)
        for key in ("max_assistant_turns", "max_tool_response_length", "max_user_turns"):
            value = getattr(self, key)
            need(value is None or value >= 1, f"{p}.{key}={value} must be >= 1 (or null: no limit)", problems)
        need(self.max_parallel_calls >= 1, f"{p}.max_parallel_calls={self.max_parallel_calls} must be >= 1", problems)
        need(self.tool_response_truncate_side in TRUNCATE_SIDES, f"{p}.tool_response_truncate_side="
             f"{self.tool_response_truncate_side!r} must be one of {', '.join(TRUNCATE_SIDES)}", problems)
        for key in ("tool_config_path", "function_tool_path"):
            path = getattr(self, key)
            need(path is None or os.path.isfile(os.path.expanduser(path)),
                 f"{p}.{key}={path!r}: no such file", problems)


@config_section(f"{ROLLOUT}.agent")
class AgentConfig(Section):
    """`rollout.agent`: verl's agent loop settings (mode=async)."""

    num_workers: int
    default_agent_loop: str
    agent_loop_config_path: str | None

    def check(self, problems: list[str]) -> None:
        p = self.__config_prefix__
        need(self.num_workers >= 1, f"{p}.num_workers={self.num_workers} must be >= 1", problems)
        path = self.agent_loop_config_path
        need(path is None or os.path.isfile(os.path.expanduser(path)),
             f"{p}.agent_loop_config_path={path!r}: no such file", problems)


@config_section(ROLLOUT)
class RolloutConfig(BranchingConfig):
    """The engine and sampling keys, with the branching knobs and the tools."""

    name: str
    mode: str
    temperature: float
    top_p: float
    top_k: int
    do_sample: bool
    dtype: str
    micro_batch_size: int | None
    static_decode: bool | None
    exact: bool
    stop: list[str]
    stop_token_ids: list[int]
    gpu_memory_utilization: float
    tensor_model_parallel_size: int
    share_cpu_engine: bool | None
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int | None
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    enforce_eager: bool
    free_cache_engine: bool
    load_format: str
    layered_summon: bool
    disable_log_stats: bool
    ignore_eos: bool
    seed: int
    engine_kwargs: dict[str, Any]
    multi_turn: MultiTurnConfig
    agent: AgentConfig
    tools: ToolsConfig

    def check(self, problems: list[str]) -> None:
        from verl.workers.rollout.registry import known_rollout_names

        super().check(problems)
        p = self.__config_prefix__
        engines = known_rollout_names()
        need(self.name in engines, f"{p}.name={self.name!r} must be one of {', '.join(engines)} (an engine of your "
             "own is selectable once actor_rollout_ref.model.external_lib has imported its module)", problems)
        need(self.mode in ROLLOUT_MODES, f"{p}.mode={self.mode!r} must be one of {', '.join(ROLLOUT_MODES)}", problems)
        need(self.temperature >= 0, f"{p}.temperature={self.temperature} must be >= 0 (0 means greedy)", problems)
        need(0 < self.top_p <= 1, f"{p}.top_p={self.top_p} must be in (0, 1]", problems)
        need(self.micro_batch_size is None or self.micro_batch_size >= 1,
             f"{p}.micro_batch_size={self.micro_batch_size} must be >= 1 (or null)", problems)


@config_section(f"{ROLLOUT}.val_kwargs")
class ValKwargsConfig(Section):
    """Sampling of validation generations."""

    top_k: int
    top_p: float
    temperature: float
    n: int
    do_sample: bool

    def check(self, problems: list[str]) -> None:
        if self.n > 1 and not self.do_sample:
            problems.append(f"{self.__config_prefix__}.n={self.n} needs val_kwargs.do_sample=true (greedy samples "
                            "would all be equal)")


@config_section(ROLLOUT)
class PPORolloutConfig(RolloutConfig):
    """`actor_rollout_ref.rollout` of training: the shared keys plus the group size, the length limits (from data.*)
    and the batch sizes of the log-prob passes."""

    n: int
    prompt_length: int
    response_length: int
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    nnodes: int  # rollout ranks of their own (trainer.v1.trainer_mode=separate_async); 0: the training ranks
    n_gpus_per_node: int
    val_kwargs: ValKwargsConfig

    def check(self, problems: list[str]) -> None:
        super().check(problems)
        p = self.__config_prefix__
        need(self.n >= 1, f"{p}.n={self.n} must be a positive integer", problems)
        need(self.nnodes >= 0, f"{p}.nnodes={self.nnodes} must be >= 0 (0: the rollout runs on the training ranks)",
             problems)
        need(self.n_gpus_per_node >= 1, f"{p}.n_gpus_per_node={self.n_gpus_per_node} must be a positive integer",
             problems)
        need(self.name != "openai", f"{p}.name=openai sends requests to a served model, which serves evaluation "
             "(python -m verl.trainer.main_generation); training needs the engine to take the actor's new weights "
             "and give log-probs: use hf or vllm", problems)
        need(self.initial_rollouts is None or self.initial_rollouts <= self.n or self.beam_size == 1,
             f"{p}.initial_rollouts={self.initial_rollouts} must be between 1 and rollout.n={self.n}", problems)
        need(self.log_prob_micro_batch_size_per_gpu is None or self.log_prob_micro_batch_size_per_gpu >= 1,
             f"{p}.log_prob_micro_batch_size_per_gpu={self.log_prob_micro_batch_size_per_gpu} must be >= 1 (or null)",
             problems)
