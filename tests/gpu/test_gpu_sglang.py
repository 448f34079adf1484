"""The SGLang engine (verl/workers/rollout/sglang_rollout.py) on CUDA against the HF engine on the same weights
(served_engines.check_engine_against_hf): greedy tokens, log-probs against the actor's, and weights pushed in memory
through the trainer's sleep / push / wake cycle. Skips where SGLang is not installed."""

from __future__ import annotations

import importlib.util

import pytest
from served_engines import check_engine_against_hf

pytestmark = pytest.mark.gpu


@pytest.mark.needs("cuda")
def test_sglang_engine_matches_the_hf_engine_and_takes_pushed_weights(tmp_path, figures):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed: pip install sglang to run the SGLang engine's test")
    from verl.workers.rollout.sglang_rollout import SGLangRollout

    def weights_released(engine):  # the actor pushes after every update: the released weights await that push
        assert engine.weights_released

    check_engine_against_hf(SGLangRollout, "SGLang", tmp_path, figures, shutdown=lambda e: e.engine.shutdown(),
                            after_sleep=weights_released)
