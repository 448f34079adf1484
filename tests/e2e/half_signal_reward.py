"""A custom reward for the group-filter e2e tests: half of the prompts carry no signal.

Prompts whose answer is even score 0 whatever the response, so every group of theirs has equal rewards and the
DAPO/Archer filters must drop it; the other prompts get the dense digit-share reward, which varies within a group.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int(ground_truth) % 2 == 0 or not solution_str:
        return 0.0
    return sum(ch.isdigit() for ch in solution_str) / len(solution_str)
