"""`python3 -m recipe.dapo.main_dapo k=v ...`: verl's DAPO entry point. DAPO is configuration here, not a separate
trainer: the dapo reward manager with its overlong buffer (reward_model.*), clip-higher (actor.clip_ratio_low/high),
token-mean loss and the group filter that refills the batch (algorithm.filter_groups.*) all run in
`verl.trainer.main_ppo`, which this calls with the same config."""

import sys

from verl.trainer.main_ppo import main

if __name__ == "__main__":
    sys.exit(main())
