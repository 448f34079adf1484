"""verl/utils/callables.py: the keyword arguments a plug-in's signature takes."""

from verl.utils.callables import accepted_keywords, takes_keyword


def test_only_the_keywords_a_function_or_class_takes_or_all_with_kwargs():
    def score(solution, ground_truth, extra_info=None, *, timeout=1.0):
        return 0.0

    class Manager:
        def __init__(self, tokenizer, num_examine, **kwargs):
            pass

    candidates = {"extra_info": {}, "timeout": 2.0, "max_resp_len": 9}
    assert accepted_keywords(score, candidates) == {"extra_info": {}, "timeout": 2.0}
    assert accepted_keywords(Manager, candidates) == candidates
    assert takes_keyword(score, "timeout") and not takes_keyword(score, "max_resp_len")
    assert takes_keyword(Manager, "anything")
