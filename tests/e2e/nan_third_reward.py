"""A custom reward for the reward-isolation e2e test: NaN for every third call, else the dense digit reward.

The driver grades one sample after the other (the naive manager), so a step of 32 samples has exactly the calls
whose running count is a multiple of 3 failing: 10 in the first step, 11 in the second.
"""

from digit_reward import compute_score as digit_share

calls = 0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global calls
    calls += 1
    return float("nan") if calls % 3 == 0 else digit_share(data_source, solution_str, ground_truth, extra_info)
