"""`python -m dapo.main_dapo k=v ...`: the Archer seeds' entry point (their repository's dapo/main_dapo.py), the
same run as `python -m verl.trainer.main_ppo` with the same overrides (DAPO and Archer are configuration here)."""

import sys

from verl.trainer.main_ppo import main

if __name__ == "__main__":
    sys.exit(main())
