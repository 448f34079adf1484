"""Tests for verl/workers/rollout/hf_rollout.py and the engine-independent parts of verl/workers/rollout/base.py."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from verl.protocol import LEFT_PAD, DataProto
from verl.utils.torch_functional import compute_position_id_with_mask, pad_2d_list_to_tensor
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.layout import generate_sequences
from verl.workers.rollout.registry import get_rollout_cls
from verl.workers.rollout.sampling import top_k_top_p_filter

PROMPTS = [[5, 9, 3], [17, 2], [40, 41, 42, 43, 44, 45]]  # different lengths, so left padding is exercised


class TagTokenizer:
    """Decodes id i to "<i>", so a stop string made of tags can only match on token boundaries."""

    pad_token_id = 0

    def __init__(self, eos_token_id=None):
        self.eos_token_id = eos_token_id

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


def toy_model(seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return toy_model(seed=0)


def greedy_tokens(engine, max_tokens=12, prompts=PROMPTS):
    outputs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return [group[0].token_ids for group in outputs]


def hf_greedy(model, prompts, max_new_tokens, pad_token_id=0):
    input_ids = pad_2d_list_to_tensor(prompts, pad_token_id, left=True)
    attention_mask = pad_2d_list_to_tensor([[1] * len(p) for p in prompts], 0, left=True)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id,
    )
    return out[:, input_ids.shape[1] :].tolist()


def test_greedy_matches_hf_generate(model):
    engine = HFRollout(copy.deepcopy(model), TagTokenizer())
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=10))
    assert [g[0].token_ids for g in outputs] == hf_greedy(model, PROMPTS, 10)
    assert all(g[0].finish_reason == "length" and g[0].stop_reason is None for g in outputs)


def test_micro_batches_give_the_same_tokens(model):
    whole = greedy_tokens(HFRollout(copy.deepcopy(model), TagTokenizer()))
    split = greedy_tokens(HFRollout(copy.deepcopy(model), TagTokenizer(), config={"micro_batch_size": 2}))
    assert split == whole


@pytest.mark.parametrize("static_decode", [False, True])
def test_log_probs_and_entropy_are_exact_at_the_sampling_temperature(model, static_decode):
    temperature = 0.7
    engine = HFRollout(copy.deepcopy(model), TagTokenizer(), seed=1, config={"static_decode": static_decode})
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=temperature, top_p=0.9, top_k=20, max_tokens=8))
    for prompt, (completion,) in zip(PROMPTS, outputs):
        ids = torch.tensor([prompt + completion.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature
        log_probs = F.log_softmax(logits, dim=-1)
        expected_lp = log_probs.gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
        expected_ent = -(log_probs.exp() * log_probs).sum(-1)
        torch.testing.assert_close(torch.tensor(completion.log_probs), expected_lp, atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(completion.entropies), expected_ent, atol=1e-4, rtol=0)


def test_eos_stops_a_row_and_drops_later_tokens(model):
    reference = greedy_tokens(HFRollout(copy.deepcopy(model), TagTokenizer()))
    eos = reference[0][3]
    engine = HFRollout(copy.deepcopy(model), TagTokenizer(eos_token_id=eos))
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12))
    for ref, (completion,) in zip(reference, outputs):
        if eos in ref:
            cut = ref.index(eos) + 1
            assert completion.token_ids == ref[:cut]
            assert (completion.finish_reason, completion.stop_reason) == ("stop", None)
        else:
            assert completion.token_ids == ref and completion.finish_reason == "length"
    assert len(outputs[0][0].token_ids) <= 4


def test_stop_token_id_sets_stop_reason(model):
    reference = greedy_tokens(HFRollout(copy.deepcopy(model), TagTokenizer()))
    stop_id = reference[1][2]
    engine = HFRollout(copy.deepcopy(model), TagTokenizer())
    ((completion,),) = engine.generate(
        [PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_id])
    )
    assert completion.token_ids == reference[1][: reference[1].index(stop_id) + 1]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_id)


def test_stop_string_stops_with_stop_reason(model):
    reference = greedy_tokens(HFRollout(copy.deepcopy(model), TagTokenizer()))[2]
    pair = reference[3:5]
    stop = TagTokenizer().decode(pair)
    first_end = next(k + 2 for k in range(len(reference) - 1) if reference[k : k + 2] == pair)
    engine = HFRollout(copy.deepcopy(model), TagTokenizer())
    ((completion,),) = engine.generate([PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=12, stop=[stop]))
    # The token that completed the stop string is kept; nothing after it is generated.
    assert completion.token_ids == reference[:first_end]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    assert len(completion.log_probs) == len(completion.entropies) == first_end


def test_max_tokens_gives_length(model):
    engine = HFRollout(copy.deepcopy(model), TagTokenizer())
    outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=5))
    assert all(len(g[0].token_ids) == 5 and g[0].finish_reason == "length" for g in outputs)


def test_top_k_1_equals_greedy(model):
    engine = HFRollout(copy.deepcopy(model), TagTokenizer(), seed=0)
    greedy = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8))
    top1 = engine.generate(PROMPTS, SamplingParams(temperature=1.0, top_k=1, max_tokens=8))
    for (g,), (t,) in zip(greedy, top1):
        assert t.token_ids == g.token_ids
        torch.testing.assert_close(torch.tensor(t.log_probs), torch.tensor(g.log_probs))


def test_sampling_from_probs_follows_the_distribution_and_never_draws_zero_mass():
    """`sample_from_probs` (inverse CDF, one uniform per row): the frequencies of 200k draws match the probabilities
    within 4 standard errors; tokens of zero mass -- also at the start and end of the vocabulary -- never come."""
    from verl.workers.rollout.sampling import sample_from_probs

    probs = torch.tensor([[0.0, 0.1, 0.0, 0.2, 0.7, 0.0], [0.5, 0.0, 0.0, 0.0, 0.0, 0.5]])
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_from_probs(probs, generator) for _ in range(100_000)])  # (draws, rows)
    for row in range(2):
        freq = torch.bincount(draws[:, row], minlength=6).double() / len(draws)
        stderr = (probs[row].double() * (1 - probs[row].double()) / len(draws)).sqrt()
        assert torch.all((freq - probs[row]).abs() <= 4 * stderr + 1e-12), (row, freq)
        assert torch.all(freq[probs[row] == 0] == 0)
    one_hot = torch.zeros(3, 50)
    one_hot[0, 0], one_hot[1, 49], one_hot[2, 7] = 1.0, 1.0, 1.0
    assert sample_from_probs(one_hot, generator).tolist() == [0, 49, 7]


def test_sampling_compiles_in_one_graph_to_the_eager_draws():
    """The static step's sampling under torch.compile (whole graph, Inductor): the top-p cumulative sums and the CDF's
    inversion go through custom ops that keep ATen's kernels (on CUDA Inductor's own long scan failed to build), and
    the compiled draws -- top-k / top-p filtering, then inverting the CDF with given uniform numbers -- are the eager
    ones."""
    from verl.workers.rollout.sampling import draw_uniforms, sample_from_probs

    def draw(logits, uniform):
        probs = torch.softmax(top_k_top_p_filter(logits, top_k=50, top_p=0.9), dim=-1)
        return sample_from_probs(probs, uniform=uniform)

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 1000, generator=generator) * 3
    uniform = draw_uniforms(8, logits.device, generator)
    torch._dynamo.reset()
    compiled = torch.compile(draw, fullgraph=True, dynamic=False)
    assert compiled(logits, uniform).tolist() == draw(logits, uniform).tolist()
    graphs = []
    torch._dynamo.reset()
    torch.compile(draw, fullgraph=True, dynamic=False, backend=lambda gm, _: graphs.append(gm.code) or gm)(
        logits, uniform)
    code = graphs[0]
    assert "torch.ops.quiver.row_cumsum" in code and "torch.ops.quiver.invert_cdf" in code
    assert "cumsum(" not in code.replace("row_cumsum(", "") and "searchsorted" not in code


def test_top_k_top_p_filter():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda out: torch.isfinite(out)[0].tolist()  # noqa: E731
    assert kept(top_k_top_p_filter(logits, top_k=2, top_p=1.0)) == [True, True, False, False]
    assert kept(top_k_top_p_filter(logits, top_k=-1, top_p=0.7)) == [True, True, False, False]
    assert kept(top_k_top_p_filter(logits, top_k=-1, top_p=0.85)) == [True, True, True, False]
    assert kept(top_k_top_p_filter(logits, top_k=-1, top_p=0.1)) == [True, False, False, False]
    assert kept(top_k_top_p_filter(logits, top_k=0, top_p=1.0)) == [True] * 4


def test_n_samples_per_prompt_and_seeded_reproducibility(model):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=10)
    first = HFRollout(copy.deepcopy(model), TagTokenizer(), seed=123).generate(PROMPTS, params)
    again = HFRollout(copy.deepcopy(model), TagTokenizer(), seed=123).generate(PROMPTS, params)
    other = HFRollout(copy.deepcopy(model), TagTokenizer(), seed=7).generate(PROMPTS, params)
    assert [len(group) for group in first] == [3, 3, 3]
    assert first == again
    assert first != other
    assert len({tuple(c.token_ids) for group in first for c in group}) > 1


def test_update_weights_loads_another_models_weights(model):
    other = toy_model(seed=1)
    engine = HFRollout(copy.deepcopy(model), TagTokenizer())
    before = greedy_tokens(engine)
    engine.update_weights(other.state_dict().items())
    after = greedy_tokens(engine)
    assert after == hf_greedy(other, PROMPTS, 12)
    assert after != before

    with pytest.raises(KeyError, match="model.not_a_weight"):
        engine.update_weights([("model.not_a_weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="lm_head.weight"):
        engine.update_weights([("lm_head.weight", torch.zeros(3, 3))])


def test_update_weights_through_a_tied_embedding(tiny_model_dir):
    module = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    engine = HFRollout(module, AutoTokenizer.from_pretrained(tiny_model_dir))
    new_embedding = torch.randn_like(module.model.embed_tokens.weight)
    engine.update_weights([("model.embed_tokens.weight", new_embedding)])
    assert torch.equal(module.lm_head.weight, new_embedding)


def test_sampling_params_and_registry():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(do_sample=False).greedy and SamplingParams(temperature=0).greedy
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    assert get_rollout_cls("hf") is HFRollout
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.name='nope'.*'hf'.*'vllm'"):
        get_rollout_cls("nope")


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("use_raw_prompt_ids", [False, True])
def test_generate_sequences_layout(tiny_model_dir, n, use_raw_prompt_ids):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    module = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    engine = HFRollout(module, tokenizer, seed=0)
    texts = ["What is 2 + 3?", "Hi", "Alice has 12 apples and gives 5 of them to Bob. How many are left?"]
    prompt_ids = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for t in texts
    ]
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    input_ids = pad_2d_list_to_tensor(prompt_ids, pad_id, left=True)
    attention_mask = pad_2d_list_to_tensor([[1] * len(p) for p in prompt_ids], 0, left=True)
    non_tensors = {"uid": ["a", "b", "c"]}
    if use_raw_prompt_ids:
        non_tensors["raw_prompt_ids"] = prompt_ids
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": compute_position_id_with_mask(attention_mask),
        },
        non_tensors=non_tensors,
        meta_info={"step": 3},
    )
    response_length = 12
    # A large max_tokens is capped at response_length; temperature 0 keeps the content deterministic.
    params = SamplingParams(n=n, temperature=0.0, max_tokens=100)
    out = generate_sequences(engine, prompts, params, response_length, pad_id, eos_id)

    bs, prompt_len, total = 3 * n, input_ids.shape[1], input_ids.shape[1] + response_length
    assert len(out) == bs
    assert out.batch["prompts"].shape == (bs, prompt_len)
    assert out.batch["responses"].shape == out.batch["response_mask"].shape == (bs, response_length)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert out.batch[key].shape == (bs, total)
    assert out.batch["rollout_log_probs"].dtype == torch.float32
    assert list(out.non_tensor_batch["uid"]) == [u for u in "abc" for _ in range(n)]
    assert out.meta_info == {"step": 3, LEFT_PAD: {"prompts": pad_id, "input_ids": pad_id, "attention_mask": 0,
                                                   "position_ids": 0}}  # the prompt side may be padded further

    expected = engine.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=response_length))
    for row in range(bs):
        completion = expected[row // n][0]
        length = len(completion.token_ids)
        response = out.batch["responses"][row]
        mask = out.batch["response_mask"][row]
        assert torch.equal(out.batch["prompts"][row], input_ids[row // n])
        assert torch.equal(out.batch["input_ids"][row], torch.cat([input_ids[row // n], response]))
        assert response[:length].tolist() == completion.token_ids
        assert (response[length:] == pad_id).all()
        assert mask.tolist() == [1] * length + [0] * (response_length - length)
        assert torch.equal(out.batch["attention_mask"][row], torch.cat([attention_mask[row // n], mask]))
        positions = out.batch["position_ids"][row]
        last_prompt_pos = len(prompt_ids[row // n]) - 1
        assert positions[prompt_len:].tolist() == list(
            range(last_prompt_pos + 1, last_prompt_pos + 1 + response_length)
        )
        torch.testing.assert_close(out.batch["rollout_log_probs"][row, :length], torch.tensor(completion.log_probs))
        assert (out.batch["rollout_log_probs"][row, length:] == 0).all()
        assert (out.batch["rollout_entropys"][row, length:] == 0).all()
        assert out.non_tensor_batch["finish_reason"][row] == completion.finish_reason
        assert out.non_tensor_batch["stop_reason"][row] == completion.stop_reason


def test_sleep_frees_the_weights_that_the_next_push_brings_back(model):
    """weights_follow on CPU: sleep() frees the parameters (the actor pushes a full state after its update); a push
    reallocates them and sampling is as before; a push that misses a parameter is refused, as is sampling first."""
    reference = greedy_tokens(HFRollout(copy.deepcopy(model), TagTokenizer()))
    engine = HFRollout(copy.deepcopy(model), TagTokenizer(), weights_follow=True)
    engine.sleep()
    assert engine.weights_released and all(p.numel() == 0 for p in engine.module.parameters())
    assert engine.weights_checksum() != engine.weights_checksum()  # nan: nothing to report
    with pytest.raises(RuntimeError, match="push them first"):
        greedy_tokens(engine)
    engine.update_weights(model.state_dict().items())
    assert greedy_tokens(engine) == reference

    engine.sleep()  # the push's targets: allocated again, full size, on the engine's device (where NCCL writes)
    targets = engine.weight_targets()
    assert all(t.device == engine.device and t.numel() > 0 for t in targets.values())
    engine.sleep()
    partial = [(n, t) for n, t in model.state_dict().items() if "layers.1.mlp" not in n]
    with pytest.raises(ValueError, match="model.layers.1.mlp"):
        engine.update_weights(partial)
    engine.wake_up()  # a woken engine that is not released keeps its weights
    kept = HFRollout(copy.deepcopy(model), TagTokenizer())  # without weights_follow nothing is freed
    kept.sleep()
    assert not kept.weights_released and greedy_tokens(kept) == reference


def test_diverged_weights_are_named_when_sampling(model):
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    engine = HFRollout(broken, TagTokenizer())
    with pytest.raises(FloatingPointError, match="weights have diverged.*actor_rollout_ref.actor.optim.lr"):
        engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=4))


@pytest.mark.parametrize("static_decode", [False, True])
def test_diverged_weights_are_named_by_both_loops_without_the_samplers_check(model, static_decode):
    """Greedy decoding never reaches the sampler's check (on CUDA that check is skipped: it would sync per token):
    both loops see the NaN in the sampled tokens' log-probs, the static loop at its periodic sync."""
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    engine = HFRollout(broken, TagTokenizer(), config={"static_decode": static_decode})
    with pytest.raises(FloatingPointError, match="weights have diverged"):
        engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=40))


# ---- the static decode loop (rollout.static_decode; on by default on CUDA) ----------------------------------------
def _completions(engine, params, prompts=PROMPTS):
    return [(c.token_ids, c.finish_reason, c.stop_reason) for group in engine.generate(prompts, params)
            for c in group]


@pytest.mark.parametrize("max_tokens", [5, 40])  # 40: past the loop's every-16-steps check whether all are done
def test_the_static_loop_gives_the_eager_loops_greedy_completions(model, max_tokens):
    reference = greedy_tokens(HFRollout(copy.deepcopy(model), TagTokenizer()), max_tokens=max_tokens)
    eos, stop_id = reference[0][3], reference[1][2]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=[stop_id])
    eager = HFRollout(copy.deepcopy(model), TagTokenizer(eos_token_id=eos), config={"static_decode": False})
    static = HFRollout(copy.deepcopy(model), TagTokenizer(eos_token_id=eos), config={"static_decode": True})
    expected = _completions(eager, params)
    assert _completions(static, params) == expected
    assert _completions(static, params) == expected  # the kept static cache, reset, gives the same again
    assert {finish for _, finish, _ in expected} >= {"stop"}  # EOS or the stop id ended some rows
    # Per-prompt max_tokens (the agent loop's budgets) end each row at its own length.
    per_prompt = [replace(params, max_tokens=m) for m in (2, 7, 4)]
    assert _completions(static, per_prompt) == _completions(eager, per_prompt)


def test_the_static_loop_draws_the_eager_loops_samples(model):
    """Until a row finishes, both loops draw the same tokens from the same seed (the static loop's log-probs and
    entropy: test_log_probs_and_entropy_are_exact_at_the_sampling_temperature)."""
    temperature = 0.7
    eager = HFRollout(copy.deepcopy(model), TagTokenizer(), seed=1, config={"static_decode": False})
    again = HFRollout(copy.deepcopy(model), TagTokenizer(), seed=1, config={"static_decode": True})
    params = SamplingParams(temperature=temperature, max_tokens=8)
    assert _completions(again, params) == _completions(eager, params)


def test_the_static_loops_step_is_one_graph_of_the_model_and_the_sampling(model):
    """On CUDA `_decode_and_sample` -- the model's step and the sampling from its logits -- is compiled into one CUDA
    graph. Here dynamo traces it with fullgraph=True (a graph break raises) and the eager backend: the same tokens as
    uncompiled, one graph per sampling setting, none compiled again for the next call's equal settings."""
    torch._dynamo.reset()
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    for params in (SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=12),
                   SamplingParams(temperature=0.0, max_tokens=12)):
        expected = _completions(HFRollout(copy.deepcopy(model), TagTokenizer(), seed=3,
                                          config={"static_decode": True}), params)
        traced = HFRollout(copy.deepcopy(model), TagTokenizer(), seed=3, config={"static_decode": True})
        traced._decode_step = torch.compile(traced._decode_and_sample, backend=backend, fullgraph=True,
                                            dynamic=False)
        assert _completions(traced, params) == expected
        before = len(graphs)
        traced.generator.manual_seed(3)
        assert _completions(traced, replace(params)) == expected  # an equal, new SamplingParams: no new graph
        assert len(graphs) == before
    assert len(graphs) == 2
    torch._dynamo.reset()


def test_the_static_loop_runs_nothing_on_the_device_between_its_steps(model):
    """Each token of the static loop is one call of its step (on CUDA one graph replay): the bookkeeping -- writing the
    token, ending the rows it finishes, the mask's next column, the positions, the random numbers -- happens inside it,
    so the operations the host dispatches outside the step do not grow with the number of tokens (below the
    every-16-steps check whether all rows are done)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.paused = 0, False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not self.paused
            return func(*args, **(kwargs or {}))

    engine = HFRollout(copy.deepcopy(model), TagTokenizer(), seed=1, config={"static_decode": True})
    step = engine._decode_step
    counter = Count()

    def uncounted(*args, **kwargs):
        counter.paused = True
        try:
            return step(*args, **kwargs)
        finally:
            counter.paused = False

    engine._decode_step = uncounted
    ops = {}
    for greedy in (True, False):
        for tokens in (4, 15):
            params = SamplingParams(temperature=0.0 if greedy else 0.8, max_tokens=tokens)
            counter.ops = 0
            with counter:
                engine.generate(PROMPTS, params)
            ops[greedy, tokens] = counter.ops
    assert ops[True, 4] == ops[True, 15] and ops[False, 4] == ops[False, 15], ops


def test_stop_strings_and_top_log_probs_take_the_eager_loop(model, monkeypatch):
    engine = HFRollout(copy.deepcopy(model), TagTokenizer(), config={"static_decode": True})
    monkeypatch.setattr(engine, "_generate_batch_static", None)  # would raise if called
    engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4, stop=["<1>"]))
    engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4, logprobs=2))


def test_static_decode_defaults_to_cuda_only(model):
    assert HFRollout(copy.deepcopy(model), TagTokenizer()).static_decode is False  # on CPU
    assert HFRollout(copy.deepcopy(model), TagTokenizer(), config={"static_decode": True}).static_decode is True


def test_the_static_loop_keeps_one_cache_shape_for_prompts_of_nearby_lengths(model):
    """Prompts are left-padded to a multiple of STATIC_PROMPT_BUCKET, so batches whose longest prompts differ by a
    few tokens reuse one static cache (on CUDA: one compiled graph), and give the eager loop's completions."""
    from verl.workers.rollout.hf_rollout import STATIC_PROMPT_BUCKET

    eager = HFRollout(copy.deepcopy(model), TagTokenizer(), config={"static_decode": False})
    static = HFRollout(copy.deepcopy(model), TagTokenizer(), config={"static_decode": True})
    params = SamplingParams(temperature=0.0, max_tokens=6)
    shapes = []
    for prompts in (PROMPTS, [p + p[-1:] * 3 for p in PROMPTS]):
        assert _completions(static, params, prompts) == _completions(eager, params, prompts)
        shapes.append(next(iter(static._static_caches)))
    assert shapes[0] == shapes[1] == (len(PROMPTS), STATIC_PROMPT_BUCKET + 6)


def test_a_runs_rollouts_share_one_cache_shape_and_validation_keeps_its_own(model):
    """With the rollout config's prompt_length and response_length the static cache spans at least those, so the
    rollouts of a run share one shape (on CUDA: one graph, compiled once) whatever their longest prompt and token
    budget; a batch of another size (validation) gets a cache of its own, and the two are kept (STATIC_CACHES_KEPT)
    so that alternating between them reuses both; a third shape evicts the least recently used."""
    from verl.workers.rollout.static_decode import STATIC_CACHES_KEPT

    config = {"static_decode": True, "prompt_length": 70, "response_length": 10}
    eager = HFRollout(copy.deepcopy(model), TagTokenizer(), config={"static_decode": False})
    static = HFRollout(copy.deepcopy(model), TagTokenizer(), config=config)
    length = 128 + 10  # 70 prompt tokens bucketed to 128, and the whole response
    longer = [p + p[-1:] * 3 for p in PROMPTS]
    for prompts, tokens in ((PROMPTS, 6), (longer, 10), (PROMPTS, 3)):
        params = SamplingParams(temperature=0.0, max_tokens=tokens)
        assert _completions(static, params, prompts) == _completions(eager, params, prompts)
        assert list(static._static_caches) == [(3, length)]
    train = static._static_caches[(3, length)]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    assert _completions(static, params, PROMPTS[:2]) == _completions(eager, params, PROMPTS[:2])  # validation
    assert list(static._static_caches) == [(3, length), (2, length)] and STATIC_CACHES_KEPT == 2
    static.generate(PROMPTS, params)
    assert static._static_caches[(3, length)] is train  # the same cache, at the same addresses
    static.generate(PROMPTS[:1], params)
    assert list(static._static_caches) == [(3, length), (1, length)]


def test_on_cuda_a_smaller_batch_decodes_in_a_kept_caches_rows(model):
    """Where each batch shape is a compiled graph (pad_to_kept_rows, CUDA's default), a batch with up to half fewer
    rows than a kept cache of its length (a last partial validation batch) runs in that cache's rows, beside copies
    of its last request, and gets the completions it gets alone; a batch under half its rows gets its own."""
    config = {"static_decode": True, "prompt_length": 8, "response_length": 10}
    eager = HFRollout(copy.deepcopy(model), TagTokenizer(), config={"static_decode": False})
    static = HFRollout(copy.deepcopy(model), TagTokenizer(), config=config)
    assert not static.pad_to_kept_rows  # on the CPU nothing is compiled: each batch decodes its own rows
    static.pad_to_kept_rows = True
    params = SamplingParams(temperature=0.0, max_tokens=10)
    four = PROMPTS + [[7, 7, 8]]
    assert _completions(static, params, four) == _completions(eager, params, four)
    kept = dict(static._static_caches)
    assert len(kept) == 1
    for prompts in (PROMPTS, PROMPTS[:2]):  # 3 and 2 rows: in the 4-row cache
        assert _completions(static, params, prompts) == _completions(eager, params, prompts)
        assert static._static_caches == kept
    assert _completions(static, params, PROMPTS[:1]) == _completions(eager, params, PROMPTS[:1])
    assert len(static._static_caches) == 2  # 1 row in 4 would waste too much: a cache of its own


def test_only_a_static_engine_on_cuda_keeps_its_weights_through_sleep(model):
    """weights_resident (the compiled graphs read the weights at fixed addresses) is CUDA's; a static engine on the
    CPU frees them like the eager one (tests/gpu/test_gpu_decode.py checks the CUDA side)."""
    engine = HFRollout(copy.deepcopy(model), TagTokenizer(), weights_follow=True, config={"static_decode": True})
    assert not engine.weights_resident
    engine.sleep()
    assert engine.weights_released
