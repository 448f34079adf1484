"""A dense custom reward for e2e tests: the share of digits in the response.

The tiny model starts far from solving the arithmetic task, so the rule reward is 0 for every sample and GRPO would
have nothing to learn from; this reward varies within every group, so each step really moves the policy.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if not solution_str:
        return 0.0
    return sum(ch.isdigit() for ch in solution_str) / len(solution_str)
