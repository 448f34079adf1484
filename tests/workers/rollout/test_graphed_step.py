"""verl/workers/rollout/static_decode.GraphedStep, exact mode's CUDA-graph decode step, on the CPU with stand-ins for
torch.cuda's graph, warm-up and capture: a capture records the step without running it (as on CUDA) and a replay runs
what was recorded. The engine's tokens and log-probs are those of the eager static loop; per kept batch shape and
sampling setting the step is warmed once, captured once and replayed after."""

from __future__ import annotations

import copy

import torch
from exact_models import PROMPTS, Tokenizer, model, rollout_batch

from verl.utils.exact_kernels import make_exact
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.static_decode import GraphedStep


class FakeGraph:
    """Holds the step a capture recorded; `replay` runs it."""

    def __init__(self):
        self.recorded = None
        self.replays = 0

    def replay(self):
        self.replays += 1
        self.recorded()


def graphed(engine: HFRollout, events: list) -> GraphedStep:
    def warm(run):
        events.append("warm")
        run()

    def capture(graph, run):
        events.append("capture")
        graph.recorded = run

    return GraphedStep(engine._decode_and_sample, new_graph=FakeGraph, warm=warm, capture=capture)


def test_the_graphed_step_gives_the_eager_loops_tokens_and_log_probs_and_captures_once_per_setting():
    actor = make_exact(model())
    eager = HFRollout(copy.deepcopy(actor), Tokenizer(), seed=0, static_decode=True)
    engine = HFRollout(copy.deepcopy(actor), Tokenizer(), seed=0, static_decode=True)
    events = []
    engine._decode_step = step = graphed(engine, events)
    sampled, greedy = SamplingParams(temperature=0.9, max_tokens=6), SamplingParams(temperature=0.0, max_tokens=6)
    for params in (sampled, greedy, sampled):
        expected = rollout_batch(eager, PROMPTS[:3], params, response_length=6)
        got = rollout_batch(engine, PROMPTS[:3], params, response_length=6)
        for key in ("responses", "rollout_log_probs", "response_mask"):
            assert torch.equal(got.batch[key], expected.batch[key]), (params, key)
    # the first sampled rollout warms (step 1) and captures (step 2) its graph; the greedy one its own; the second
    # sampled rollout, in the same kept cache, only replays
    assert events == ["warm", "capture", "warm", "capture"] and step.captured == 2
    (slot,) = engine._static_caches.values()
    graphs = slot.state.graphs
    assert len(graphs) == 2 and all(isinstance(graph, FakeGraph) for graph in graphs.values())
    # 5 decode steps a rollout (the first token is the prefill's): 4 replays after the warm-up, then all 5
    assert sum(graph.replays for graph in graphs.values()) == 4 + 4 + 5


def test_a_new_batch_shape_gets_its_own_graphs():
    engine = HFRollout(make_exact(model()), Tokenizer(), seed=0, static_decode=True)
    events = []
    engine._decode_step = graphed(engine, events)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    rollout_batch(engine, PROMPTS[:2], params, response_length=4)
    rollout_batch(engine, PROMPTS[:3], params, response_length=4)
    assert events == ["warm", "capture"] * 2
    assert [len(slot.state.graphs) for slot in engine._static_caches.values()] == [1, 1]
