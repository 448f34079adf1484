"""verl/workers/rollout/base.py: the one SamplingParams a rollout config asks for, read by the workers' generation
and by offline generation alike; and the branching draws' seed that both tool loops take."""

from omegaconf import OmegaConf

from verl.trainer.config import load_config
from verl.workers.config.rollout import branch_seed
from verl.workers.rollout.base import SamplingParams


def test_the_rollout_config_gives_one_sampling_for_training_validation_and_a_call():
    rollout = load_config(overrides=[
        "actor_rollout_ref.rollout.temperature=0.7", "actor_rollout_ref.rollout.top_k=20",
        "actor_rollout_ref.rollout.response_length=12", "actor_rollout_ref.rollout.stop=['</answer>']",
        "actor_rollout_ref.rollout.stop_token_ids=[7]", "actor_rollout_ref.rollout.val_kwargs.temperature=0",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=false"]).actor_rollout_ref.rollout
    assert SamplingParams.of_rollout(rollout) == SamplingParams(
        n=1, temperature=0.7, top_p=1.0, top_k=20, max_tokens=12, stop=["</answer>"], stop_token_ids=[7])
    validation = SamplingParams.of_rollout(rollout, validate=True)
    assert (validation.temperature, validation.do_sample, validation.greedy, validation.stop) == (0, False, True,
                                                                                                  ["</answer>"])
    call = SamplingParams.of_rollout(rollout, overrides={"temperature": 1.0, "max_tokens": 3, "validate": True})
    assert (call.temperature, call.max_tokens, call.top_k) == (1.0, 3, 20)


def test_offline_generation_samples_as_its_rollout_config_says_stop_strings_included():
    rollout = load_config("generation", ["rollout.stop=['####']", "rollout.temperature=0.5"]).rollout
    params = SamplingParams.of_rollout(rollout, n=4)
    assert (params.n, params.temperature, params.stop, params.max_tokens) == (4, 0.5, ["####"],
                                                                              rollout.response_length)
    assert SamplingParams.of_rollout(OmegaConf.create({
        "temperature": 1.0, "top_p": 0.9, "top_k": -1, "response_length": 5, "do_sample": True})).stop is None


def test_ranks_draw_their_branches_from_seeds_of_their_own():
    assert [branch_seed(3, rank) for rank in range(3)] == [3, 1_000_006, 2_000_009]
    assert branch_seed(None, 2) is None  # an unseeded run stays unseeded
