"""verl 0.9.1's `skip.rollout`: a step's generated rollouts kept on disk and replayed in a later run instead of
generating, so that a change to the reward or the loss is debugged on the same samples.

With skip.rollout.enable, each generation call of a step listed in skip.rollout.steps (the trainer's global steps;
[] lists none, as in verl) either generates and dumps what it generated, or loads a dump in place of generating:

- action=cache: the step's own dump if there is one, else generate and dump it.
- action=repeat: the dump of the nearest step (this one, else the latest before, else the earliest after), with the
  prompts and rows it was made from, else generate and dump.

The dumps of a run lie under `<dump_dir>/<experiment_name>_<project_name>/GBS<gen batch>_N<rollout.n>_in<max prompt>
_out<max response>/<step>/` (verl's layout), one file per generation call of the step (DAPO's filter_groups makes
several): `gen_batch_<k>.pt` holds the prompts' rows, what generation read and what it returned (tensors, non-tensor
columns and meta-info, not its metrics). A dump is written to a temporary file and renamed, so a run stopped while
writing leaves the whole file or none. A dump of the step's own prompts must be of exactly those prompts: one whose
prompt ids or row count differ from the step's batch (another data set, seed or config) is an error naming the file,
never a silent replay of other samples.

The synchronous trainer only: with trainer.v1.trainer_mode colocate_async or separate_async (or async_training), a
step's rollouts are generated ahead of the step, so there is no generation of the step to replace.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.utils.config import ConfigError

PREFIX = "[skip.rollout]"


def run_dump_dir(dump_dir: str, experiment_name: str, project_name: str, gen_batch_size: int, n: int,
                 max_prompt_length: int, max_response_length: int) -> str:
    """The directory of one run's dumps: a run of another experiment or batch shape never reads them."""
    return os.path.join(os.path.abspath(os.path.expanduser(dump_dir)), f"{experiment_name}_{project_name}",
                        f"GBS{gen_batch_size}_N{n}_in{max_prompt_length}_out{max_response_length}")


def save_rollouts(path: str, rows: DataProto, gen_batch: DataProto, output: DataProto) -> None:
    """Write one generation call to `path` atomically: the prompts' `rows`, the `gen_batch` generation read and its
    `output` (less its metrics, which describe that generation and not a replay)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    generated = DataProto(batch=output.batch, non_tensor_batch=dict(output.non_tensor_batch),
                          meta_info={key: value for key, value in output.meta_info.items() if key != "metrics"})
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save({"rows": rows, "gen_batch": gen_batch, "output": generated}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_rollouts(path: str) -> tuple[DataProto, DataProto, DataProto]:
    """(rows, gen_batch, output) of the dump at `path`."""
    state = torch.load(path, weights_only=False)
    return state["rows"], state["gen_batch"], state["output"]


def dump_mismatch(dumped_gen_batch: DataProto, output: DataProto, gen_batch: DataProto, n: int,
                  same_prompts: bool) -> str | None:
    """Why a dump cannot stand in for this generation call of `gen_batch` (n responses per prompt), else None.
    `same_prompts`: the dump must have been made from exactly `gen_batch`'s prompt ids."""
    if len(dumped_gen_batch) != len(gen_batch):
        return f"it holds the rollouts of {len(dumped_gen_batch)} prompts, the step's batch has {len(gen_batch)}"
    if len(output) != len(dumped_gen_batch) * n:
        return (f"it holds {len(output)} rollouts, not {len(dumped_gen_batch)} prompts x actor_rollout_ref.rollout.n="
                f"{n} = {len(dumped_gen_batch) * n}")
    if same_prompts:
        theirs, mine = dumped_gen_batch.batch["input_ids"], gen_batch.batch["input_ids"]
        if theirs.shape != mine.shape:
            return f"its prompt ids are {tuple(theirs.shape)}, the step's {tuple(mine.shape)}"
        differ = (theirs != mine).any(dim=1).nonzero().flatten()
        if len(differ):
            return f"the prompt ids of {len(differ)} of its {len(mine)} prompts differ (the first: row {differ[0]})"
    return None


def _with_group_ids(data: DataProto, rows: DataProto) -> DataProto:
    """`data` (a dump's rows or generation batch) under the group ids of this step's `rows`."""
    if "uid" in data.non_tensor_batch:
        data.non_tensor_batch["uid"] = rows.non_tensor_batch["uid"]
    return data


def replay_rollouts(path: str, rows: DataProto, gen_batch: DataProto, n: int,
                    same_prompts: bool) -> tuple[DataProto, DataProto, DataProto]:
    """(rows, gen_batch, output) from the dump at `path`, in place of generating `gen_batch` n times.

    same_prompts (cache, or repeat finding the step's own dump): the dump must be of `gen_batch`'s prompts, and the
    step's rows stay. Otherwise (repeat of another step) the dump's rows and prompts replace the step's, under the
    step's group ids. Either way the output carries the prompts' columns of now (the uid with agent loops), so it
    joins the rows it is trained with. A dump that does not fit is a ValueError naming the file.
    """
    dumped_rows, dumped_gen_batch, output = load_rollouts(path)
    problem = dump_mismatch(dumped_gen_batch, output, gen_batch, n, same_prompts)
    if problem is not None:
        raise ValueError(f"skip.rollout: the dump {path} does not fit this step's batch: {problem}. It was made by "
                         "another data set, seed or config: delete it, or set skip.rollout.dump_dir elsewhere")
    if not same_prompts:
        dumped_gen_batch.meta_info = gen_batch.meta_info  # this step's (global_steps)
        rows, gen_batch = _with_group_ids(dumped_rows, rows), _with_group_ids(dumped_gen_batch, rows)
    for key, values in gen_batch.non_tensor_batch.items():
        output.non_tensor_batch[key] = np.repeat(values, n, axis=0)  # prompt i's n responses are adjacent
    output.meta_info.update(gen_batch.meta_info)
    return rows, gen_batch, output


class RolloutReplay:
    """skip.rollout for one run: where its dumps lie (`root`), which global steps dump or replay, and how (`action`:
    cache | repeat; see the module docstring)."""

    def __init__(self, root: str, steps, action: str):
        self.root, self.steps, self.action = root, set(steps), action
        self._step, self._calls = None, 0  # generation calls made so far in the current step

    @classmethod
    def from_config(cls, config: DictConfig, gen_batch_size: int, trainer_mode: str) -> RolloutReplay | None:
        """The run's replay (None with skip.rollout.enable=false); a ConfigError in an asynchronous `trainer_mode`
        (the run plan's, which async_training can set too)."""
        section = config.skip.rollout
        if not section.enable:
            return None
        if trainer_mode != "sync":
            raise ConfigError(f"skip.rollout.enable=true: replaying dumped rollouts runs in the synchronous trainer "
                              f"only (trainer.v1.trainer_mode=sync); this run's mode is {trainer_mode}, whose "
                              "generation runs ahead of the step: set skip.rollout.enable=false, or train synchronously")
        data = config.data
        root = run_dump_dir(section.dump_dir, config.trainer.experiment_name, config.trainer.project_name,
                            gen_batch_size, config.actor_rollout_ref.rollout.n, data.max_prompt_length,
                            data.max_response_length)
        replay = cls(root, list(section.steps), section.action)
        if replay.steps:
            print(f"{PREFIX} steps {sorted(replay.steps)} replay their dumps or dump their rollouts "
                  f"(action={replay.action}) under {root}")
        else:
            print(f"{PREFIX} warning: skip.rollout.enable=true but skip.rollout.steps=[] lists no step, so nothing is "
                  "dumped or replayed (verl's meaning); list the global steps, e.g. skip.rollout.steps=[1,2]")
        return replay

    def path(self, step: int, call: int) -> str:
        """The dump of generation call `call` (0, 1, ...) of global step `step`."""
        return os.path.join(self.root, str(step), f"gen_batch_{call}.pt")

    def _source(self, step: int, call: int) -> str | None:
        """The dump this call replays; None: generate and dump."""
        own = self.path(step, call)
        if os.path.isfile(own):
            return own
        if self.action == "cache" or not os.path.isdir(self.root):
            return None
        dumped = sorted(int(name) for name in os.listdir(self.root)
                        if name.isdigit() and os.path.isfile(self.path(int(name), call)))
        earlier, later = [s for s in dumped if s < step], [s for s in dumped if s > step]
        nearest = earlier[-1] if earlier else (later[0] if later else None)
        return None if nearest is None else self.path(nearest, call)

    def _next_call(self, step: int) -> int:
        if step != self._step:
            self._step, self._calls = step, 0
        self._calls += 1
        return self._calls - 1

    def rollouts(self, step: int, rows: DataProto, gen_batch: DataProto, n: int,
                 generate: Callable[[DataProto], DataProto]) -> tuple[DataProto, DataProto, DataProto, bool]:
        """One generation call of global step `step`: (rows, gen_batch, output, replayed), the output generated by
        `generate(gen_batch)` (and dumped where the step is listed) or replayed from a dump."""
        if step not in self.steps:
            return rows, gen_batch, generate(gen_batch), False
        call = self._next_call(step)
        own, source = self.path(step, call), self._source(step, call)
        if source is None:
            output = generate(gen_batch)
            save_rollouts(own, rows, gen_batch, output)
            print(f"{PREFIX} step {step}: generated {len(output)} rollouts, dumped to {own}")
            return rows, gen_batch, output, False
        rows, gen_batch, output = replay_rollouts(source, rows, gen_batch, n, same_prompts=source == own)
        print(f"{PREFIX} step {step}: replayed {len(output)} rollouts from {source} instead of generating")
        return rows, gen_batch, output, True
