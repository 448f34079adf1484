"""`python -m dapo.main_dapo k=v ...`: the Archer seeds' entry point (their repository's dapo/main_dapo.py), the
same run as `python -m verl.trainer.main_ppo` with the same overrides (DAPO and Archer are configuration here), but
for one thing the seed's entry point hard-wires: its reward function, Archer's graders of its math and code sets
(verl/utils/reward_score/archer.py), unless the command names another with custom_reward_function.path."""

import sys

from verl.trainer.main_ppo import main
from verl.utils.reward_score import archer

ARCHER_REWARD = archer.__file__


def archer_argv(argv: list[str]) -> list[str]:
    """`argv` with Archer's reward function, where no custom_reward_function.path is given."""
    if any(arg.lstrip("+").startswith("custom_reward_function.path=") for arg in argv):
        return list(argv)
    return [*argv, f"custom_reward_function.path={ARCHER_REWARD}"]


if __name__ == "__main__":
    sys.exit(main(archer_argv(sys.argv[1:])))
