"""A reward with two components for GDPO's e2e test: the share of digits and the shortness of the response.

The score is their sum; the components come back as extra columns (`digits`, `short`), which
algorithm.gdpo_reward_keys names.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    digits = sum(ch.isdigit() for ch in solution_str) / len(solution_str) if solution_str else 0.0
    short = 1.0 / (1.0 + len(solution_str))
    return {"score": digits + short, "digits": digits, "short": short}
