"""`data.sampler.class_path` / `class_name` (verl/utils/dataset/rl_dataset.py `load_user_sampler`): a user's sampler
class is built as verl builds it and picks the rows; each way it can be wrong is a ConfigError naming the key; a
curriculum sampler needs data.dataloader_num_workers=0; a resumed dataloader continues the user sampler's order.

verl's curriculum example scripts name `pkg://tests.utils.dataset.test_create_rl_sampler_on_cpu` and its
`RandomCurriculumSampler`: this file is that module here, so those scripts run unchanged from the repository root."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import RandomSampler

from verl.experimental.dataset.sampler import AbstractCurriculumSampler
from verl.utils.config import ConfigError
from verl.utils.dataset.rl_dataset import create_dataloader, create_rl_sampler, curriculum_update


class RandomCurriculumSampler(AbstractCurriculumSampler):
    """The sampler verl's curriculum example scripts name: a seeded random order; update() changes nothing."""

    def __init__(self, data_source, data_config):
        generator = torch.Generator()
        generator.manual_seed(1)
        self.sampler = RandomSampler(data_source, generator=generator)

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)

    def update(self, batch) -> None:
        pass


# A file of the user's: a sampler that yields every third row from the end, and one that reads its own setting.
USER_SAMPLERS = '''
from torch.utils.data import Sampler


class EveryThirdFromTheEnd(Sampler):
    def __init__(self, data_source, data_config):
        self.rows = list(range(len(data_source) - 1, -1, -3))
        self.data_config = data_config

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)


class NoLength(Sampler):
    def __init__(self, data_source, data_config):
        pass

    def __iter__(self):
        return iter([0])


class OtherSignature(Sampler):
    def __init__(self, dataset):
        pass


class NotASampler:
    def __init__(self, data_source, data_config):
        pass


class Curriculum(EveryThirdFromTheEnd):
    def update(self, batch):
        pass
'''

# A curriculum sampler whose order its updates decide (each update moves the next rows by 100), with its own state.
SHIFTING = '''
from verl.experimental.dataset.sampler import AbstractCurriculumSampler


class Shifting(AbstractCurriculumSampler):
    def __init__(self, data_source, data_config):
        self.n, self.shift = len(data_source), 0

    def __iter__(self):
        for position in range(self.n):
            yield (position + self.shift) % self.n

    def __len__(self):
        return self.n

    def update(self, batch):
        self.shift += 100
'''

STATEFUL = SHIFTING.replace("class Shifting", "class StatefulShifting") + '''
    def state_dict(self):
        return {"shift": self.shift}

    def load_state_dict(self, state):
        self.shift = state["shift"]
'''


def data_config(path, name, **extra):
    return OmegaConf.create({"sampler": {"class_path": str(path), "class_name": name}, "dataloader_num_workers": 0,
                             **extra})


@pytest.fixture
def samplers_file(tmp_path):
    path = tmp_path / "my_rl_samplers.py"
    path.write_text(USER_SAMPLERS)
    return path


def test_a_user_sampler_from_a_file_picks_the_rows(samplers_file):
    config = data_config(samplers_file, "EveryThirdFromTheEnd")
    sampler = create_rl_sampler(config, list(range(10)))
    assert list(sampler) == [9, 6, 3, 0] and len(sampler) == 4 and sampler.data_config is config
    assert curriculum_update(sampler) is None
    assert curriculum_update(create_rl_sampler(data_config(samplers_file, "Curriculum"), list(range(10)))) is not None


def test_verls_example_class_path_builds_its_curriculum_sampler(monkeypatch):
    """The class path and name verl's examples/sglang_multiturn curriculum scripts pass. Their users launch
    `python3 -m verl.trainer.main_ppo` from the repository root, which puts it on sys.path (pytest need not)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    config = data_config("pkg://tests.utils.dataset.test_create_rl_sampler_on_cpu", "RandomCurriculumSampler")
    sampler = create_rl_sampler(config, list(range(8)))
    assert type(sampler.sampler).__name__ == "RandomCurriculumSampler" and sorted(sampler) == list(range(8))
    assert curriculum_update(sampler) is not None


def test_without_a_class_path_shuffle_decides():
    config = OmegaConf.create({"sampler": {"class_path": None, "class_name": None}, "shuffle": False})
    assert list(create_rl_sampler(config, list(range(5)))) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("path", "name", "message"), [
    ("{dir}/missing_samplers.py", "X", r"data\.sampler\.class_path: could not import '.*missing_samplers\.py'"),
    ("pkg://no_such_sampler_module", "X", r"data\.sampler\.class_path: could not import 'no_such_sampler_module'"),
    ("{file}", None, r"data\.sampler\.class_path='.*my_rl_samplers\.py' needs data\.sampler\.class_name"),
    ("{file}", "Missing", r"data\.sampler\.class_name='Missing': data\.sampler\.class_path='.*my_rl_samplers\.py' "
                          r"defines no such name \(its samplers: Curriculum, EveryThirdFromTheEnd, NoLength, "
                          r"OtherSignature\)"),
    ("{file}", "NotASampler", r"data\.sampler\.class_name='NotASampler' in .* is not a torch\.utils\.data\.Sampler"),
    ("{file}", "OtherSignature", r"OtherSignature\(data_source=dataset, data_config=data\) failed"),
    ("{file}", "NoLength", r"data\.sampler\.class_name='NoLength' has no __len__"),
])
def test_a_sampler_that_cannot_be_built_is_a_config_error_naming_the_key(samplers_file, path, name, message):
    path = path.format(dir=samplers_file.parent, file=samplers_file)
    with pytest.raises(ConfigError, match=message):
        create_rl_sampler(data_config(path, name), list(range(10)))


def test_a_curriculum_sampler_needs_no_dataloader_workers(samplers_file):
    with pytest.raises(ConfigError, match=r"data\.dataloader_num_workers=2 must be 0 with the curriculum sampler "
                                          r"data\.sampler\.class_name='Curriculum'"):
        create_rl_sampler(data_config(samplers_file, "Curriculum", dataloader_num_workers=2), list(range(10)))
    # a sampler without update() may have workers
    create_rl_sampler(data_config(samplers_file, "EveryThirdFromTheEnd", dataloader_num_workers=2), list(range(10)))


def test_the_sampler_keys_are_checked_before_anything_is_built(tmp_path):
    from verl.trainer.config import load_config
    from verl.trainer.ppo.config_rules import validate_ppo_config

    with pytest.raises(ConfigError, match=r"data\.sampler\.class_path=None and data\.sampler\.class_name='X': set "
                                          "both"):
        validate_ppo_config(load_config(overrides=["data.sampler.class_name=X"]))
    with pytest.raises(ConfigError, match=r"data\.sampler\.class_path='.*gone\.py': no such file"):
        validate_ppo_config(load_config(overrides=[f"data.sampler.class_path={tmp_path}/gone.py",
                                                   "data.sampler.class_name=X"]))


def _loader(path, name):
    sampler = create_rl_sampler(data_config(path, name), list(range(1000)))
    return sampler, create_dataloader(list(range(1000)), batch_size=4, sampler=sampler, collate_fn=list)


@pytest.mark.parametrize("name", ["Shifting", "StatefulShifting"])
def test_a_resumed_dataloader_continues_the_user_samplers_order(tmp_path, name):
    """A checkpoint's dataloader state (torch.save'd as the trainer saves it) restores the position in the epoch and
    the user sampler's own state where it has one: the order its updates decided goes on; without a state_dict the
    rows after the position are a new sampler's."""
    path = tmp_path / f"{name.lower()}_sampler.py"
    path.write_text(STATEFUL if name == "StatefulShifting" else SHIFTING)
    sampler, loader = _loader(path, name)
    batches = iter(loader)
    seen = [next(batches)]
    sampler.update(None)
    seen.append(next(batches))
    sampler.update(None)
    torch.save({"dataloader": loader.state_dict()}, tmp_path / "data.pt")
    assert seen == [[0, 1, 2, 3], [104, 105, 106, 107]]
    expected_next = next(batches)  # the uninterrupted run's third batch
    assert expected_next == [208, 209, 210, 211]

    _, resumed = _loader(path, name)
    resumed.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=False)["dataloader"])
    # with its state the sampler continues with its updates; without, a new one is skipped past the 8 rows taken
    assert next(iter(resumed)) == (expected_next if name == "StatefulShifting" else [8, 9, 10, 11])
