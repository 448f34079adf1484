"""The actor's micro-batching must not change the update: same gradient as one pass over the mini-batch."""

import copy
import math
import socket

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import leave_group, spawn
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.protocol import DataProto
from verl.utils.run_plan import MicroBatches, UpdateBatches
from verl.utils.torch_functional import logprobs_from_logits
from verl.workers.actor.dp_actor import DataParallelPPOActor

PROMPT, RESPONSE, VOCAB = 5, 6, 50


def _model():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    return Qwen2ForCausalLM(config).eval()


def _config(**overrides):
    cfg = {
        "ppo_mini_batch_size": 6, "ppo_micro_batch_size_per_gpu": None, "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 1000, "ppo_epochs": 1, "shuffle": False, "clip_ratio": 0.2,
        "clip_ratio_low": None, "clip_ratio_high": None, "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean",
        "entropy_coeff": 0.0, "use_kl_loss": False, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl",
        "policy_loss": {"loss_mode": "vanilla"}, "optim": {"clip_grad": 1e9},
    }
    cfg.update(overrides)
    return OmegaConf.create(cfg)


def _actor(cfg, model, optimizer=None, use_remove_padding=False):
    """The actor, its planned batches read from the test config's ppo_* keys as per-rank sizes (what the run plan
    makes of a one-rank run's config)."""
    dynamic = cfg.use_dynamic_bsz
    micro = MicroBatches(None if dynamic else cfg.ppo_micro_batch_size_per_gpu,
                         cfg.ppo_max_token_len_per_gpu if dynamic else None, "ppo_micro_batch_size_per_gpu")
    return DataParallelPPOActor(cfg, model, optimizer, use_remove_padding=use_remove_padding,
                                batches=UpdateBatches(cfg.ppo_mini_batch_size, micro))


def _batch(model):
    """6 sequences with left-padded prompts and responses of different valid lengths."""
    torch.manual_seed(1)
    bs = 6
    prompt_lens = [5, 3, 4, 5, 2, 4]
    response_lens = [6, 1, 3, 6, 4, 2]
    prompts = torch.randint(3, VOCAB, (bs, PROMPT))
    responses = torch.randint(3, VOCAB, (bs, RESPONSE))
    attention = torch.zeros(bs, PROMPT + RESPONSE, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attention[i, PROMPT - p : PROMPT + r] = 1
    position_ids = torch.clip(torch.cumsum(attention, -1) - 1, min=0)
    input_ids = torch.cat([prompts, responses], -1)
    response_mask = attention[:, PROMPT:]
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids).logits
        old = logprobs_from_logits(logits[:, PROMPT - 1 : -1], responses)
    data = DataProto.from_dict(tensors={
        "input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids, "responses": responses,
        "response_mask": response_mask, "old_log_probs": old - 0.05 * torch.randn(bs, RESPONSE),
        "ref_log_prob": old + 0.1 * torch.randn(bs, RESPONSE),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])[:, None] * response_mask,
    }, meta_info={"temperature": 0.7})
    return data


def _update(model, data, **overrides):
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    actor = _actor(_config(**overrides), model, optimizer)
    metrics = actor.update_policy(data)
    return model, metrics


@pytest.mark.parametrize("overrides", [
    {"ppo_micro_batch_size_per_gpu": 2},
    {"ppo_micro_batch_size_per_gpu": 1, "loss_agg_mode": "seq-mean-token-mean"},
    {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 22},
    {"ppo_micro_batch_size_per_gpu": 3, "use_kl_loss": True, "entropy_coeff": 0.01},
])
def test_micro_batches_give_the_full_batch_update(overrides, assert_same_update):
    model = _model()
    data = _batch(model)
    full_overrides = {k: v for k, v in overrides.items() if k not in ("ppo_micro_batch_size_per_gpu", "use_dynamic_bsz",
                                                                      "ppo_max_token_len_per_gpu")}
    reference, ref_metrics = _update(model, data, **full_overrides)
    split, metrics = _update(model, data, **overrides)
    assert len(metrics["actor/pg_loss"]) > 1  # really split
    assert_same_update(split, metrics, reference, ref_metrics, "actor/grad_norm")


def test_compute_log_prob_matches_forward_and_restores_order_with_dynamic_bsz():
    model = _model()
    data = _batch(model)
    actor = _actor(_config(), model)
    actor.log_prob = MicroBatches(None, None, "micro")  # the plan's log-prob micro-batches: all at once
    full, entropy = actor.compute_log_prob(data, calculate_entropy=True)
    actor.log_prob = MicroBatches(None, 22, "budget")  # use_dynamic_bsz with a budget of 22 tokens
    dynamic, dyn_entropy = actor.compute_log_prob(data, calculate_entropy=True)
    torch.testing.assert_close(dynamic, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dyn_entropy, entropy, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                       position_ids=data.batch["position_ids"]).logits[:, PROMPT - 1 : -1] / 0.7
    torch.testing.assert_close(full, logprobs_from_logits(logits, data.batch["responses"]), atol=1e-5, rtol=1e-5)


def test_ppo_epochs_take_one_step_per_mini_batch_and_epoch():
    model = _model()
    _, metrics = _update(model, _batch(model), ppo_mini_batch_size=3, ppo_epochs=2)
    assert len(metrics["actor/grad_norm"]) == 4


def test_non_finite_gradient_skips_the_step():
    model = _model()
    data = _batch(model)
    data.batch["advantages"][0, 0] = float("nan")
    updated, metrics = _update(model, data)
    assert math.isnan(metrics["actor/grad_norm"][0])
    assert metrics["actor/skipped_steps"] == [1.0] and metrics["actor/skipped_steps_in_row"] == [1.0]
    for p_before, p_after in zip(model.parameters(), updated.parameters()):
        assert torch.equal(p_before, p_after)


def test_skipped_steps_are_counted_in_a_row_across_updates():
    """Mini-batches of 3 rows: a NaN advantage in row 4 poisons the second optimizer step of each update only."""
    model = _model()
    data = _batch(model)
    data.batch["advantages"][4, 0] = float("nan")
    module = copy.deepcopy(model)
    actor = _actor(_config(ppo_mini_batch_size=3), module, torch.optim.SGD(module.parameters(), lr=0.0))
    first = actor.update_policy(data)
    assert math.isfinite(first["actor/grad_norm"][0]) and math.isnan(first["actor/grad_norm"][1])
    assert first["actor/skipped_steps"] == [1.0] and first["actor/skipped_steps_in_row"] == [1.0]
    data.batch["advantages"][0, 0] = float("nan")  # now both steps of the next update are skipped
    second = actor.update_policy(data)
    assert second["actor/skipped_steps"] == [2.0] and second["actor/skipped_steps_in_row"] == [3.0]
    data.batch["advantages"] = torch.nan_to_num(data.batch["advantages"])
    third = actor.update_policy(data)
    assert third["actor/skipped_steps"] == [0.0] and third["actor/skipped_steps_in_row"] == [0.0]


def _spy_on_loss(monkeypatch):
    """Register a vanilla-PPO loss that records what the actor passes it; returns the list of recorded calls."""
    from verl.algorithms import registry
    from verl.algorithms.losses import compute_policy_loss_vanilla

    calls = []

    def spy(**kwargs):
        calls.append({k: v for k, v in kwargs.items()
                      if k in ("advantages", "entropy", "response_mask", "rollout_is_weights")})
        return compute_policy_loss_vanilla(**kwargs)

    monkeypatch.setitem(registry.POLICY_LOSS_REGISTRY, "spy", spy)
    return calls


def test_entropy_aware_advantage_reaches_the_loss_with_entropy_coeff_zero(monkeypatch):
    from verl.algorithms.losses import entropy_aware_advantage

    model = _model()
    data = _batch(model)
    calls = _spy_on_loss(monkeypatch)
    _update(model, data, policy_loss={"loss_mode": "spy"}, enable_entropy_balanced_advantage=True,
            entropy_advantage_alpha=0.3)
    (call,) = calls
    # AEPO's released code skipped this when entropy_coeff=0; here the entropy is computed because the advantage needs it.
    assert call["entropy"] is not None and not call["entropy"].requires_grad
    expected = entropy_aware_advantage(data.batch["advantages"], call["entropy"], call["response_mask"], alpha=0.3)
    torch.testing.assert_close(call["advantages"], expected)
    assert not torch.equal(call["advantages"], data.batch["advantages"])

    calls.clear()
    _update(model, data, policy_loss={"loss_mode": "spy"})
    assert calls[0]["entropy"] is None and torch.equal(calls[0]["advantages"], data.batch["advantages"])


def test_split_kl_loss_weighs_only_low_entropy_tokens():
    from verl.algorithms.kl import kl_penalty
    from verl.algorithms.losses import split_by_token_entropy
    from verl.utils.torch_functional import entropy_from_logits

    model = _model()
    data = _batch(model)
    data.batch["advantages"] = torch.zeros_like(data.batch["advantages"])  # only the KL term moves the weights
    coef = 0.5
    updated, metrics = _update(model, data, use_kl_loss=True, kl_loss_coef=coef, use_token_entropy_separate=True,
                               token_entropy_quantile=0.5, high_entropy_kl_loss_scale_coef=0.0)
    assert metrics["actor/high_entropy_kl_loss_scale_coef"] == [0.0]
    assert metrics["actor/kl_loss"][0] == pytest.approx(
        metrics["actor/low_entropy_kl_loss"][0] + metrics["actor/high_entropy_kl_loss"][0])

    # By hand: coef * mean of the k3 KL over the low-entropy tokens; one SGD step of lr 1.
    manual = copy.deepcopy(model).train()
    batch = data.batch
    logits = manual(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"]).logits[:, PROMPT - 1 : -1].float() / 0.7
    log_prob = logprobs_from_logits(logits, batch["responses"])
    _, low = split_by_token_entropy(entropy_from_logits(logits).detach(), batch["response_mask"], 0.5)
    kld = kl_penalty(log_prob, batch["ref_log_prob"], "low_var_kl")
    (coef * kld[low].mean()).backward()
    with torch.no_grad():
        for (name, p_manual), (_, p_actor) in zip(manual.named_parameters(), updated.named_parameters()):
            torch.testing.assert_close(p_actor, p_manual - p_manual.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("overrides", [{}, {"ppo_micro_batch_size_per_gpu": 2, "use_kl_loss": True},
                                       {"policy_loss": {"loss_mode": "aspo"}, "entropy_coeff": 0.01}])
def test_on_policy_update_without_old_log_probs_equals_the_recomputed_pass(overrides):
    """One epoch over one mini-batch: skipping the old-log-prob pass (the actor detaches its own log-probs) gives the
    update that the recomputed old log-probs give."""
    model = _model()
    data = _batch(model)
    actor = _actor(_config(**overrides), model)
    recomputed, _ = actor.compute_log_prob(data)
    with_pass = DataProto.from_dict(tensors={**data.batch, "old_log_probs": recomputed}, meta_info=data.meta_info)
    without_pass = DataProto.from_dict(tensors={k: v for k, v in data.batch.items() if k != "old_log_probs"},
                                       meta_info=data.meta_info)
    model_a, metrics_a = _update(model, with_pass, **overrides)
    model_b, metrics_b = _update(model, without_pass, **overrides)
    assert metrics_a["actor/pg_loss"] == pytest.approx(metrics_b["actor/pg_loss"], abs=1e-6)
    assert any((p - q).abs().max() > 1e-4 for p, q in zip(model.parameters(), model_a.parameters()))  # it moved
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_off_policy_update_without_old_log_probs_is_refused():
    model = _model()
    data = _batch(model)
    data.batch.pop("old_log_probs")
    with pytest.raises(ValueError, match="ppo_epochs=2"):
        _update(model, data, ppo_epochs=2)
    with pytest.raises(ValueError, match="mini-batches of 3"):
        _update(model, data, ppo_mini_batch_size=3)


def _with_shared_left_padding(data, columns=3):
    """The same batch with `columns` more padding columns on the left of every row (random ids under mask 0)."""
    bs = len(data)
    padded = data.batch.clone()
    for key in ("input_ids", "attention_mask", "position_ids"):
        fill = torch.randint(3, VOCAB, (bs, columns)) if key == "input_ids" else torch.zeros(bs, columns,
                                                                                              dtype=torch.long)
        padded[key] = torch.cat([fill, data.batch[key]], -1)
    return DataProto(batch=padded, meta_info=dict(data.meta_info))


@pytest.mark.parametrize("chunking,one_row", [({}, False), ({"entropy_from_logits_with_chunking": True}, False),
                                              ({}, True)])
def test_remove_padding_gives_the_padded_log_probs_and_entropy(chunking, one_row, monkeypatch):
    monkeypatch.setattr("verl.workers.actor.dp_actor.LOGITS_CHUNK", 4)
    model = _model()
    data = _batch(model)
    data.meta_info.update(micro_batch_size=4, use_dynamic_bsz=False)
    mask = data.batch["response_mask"].bool()
    padded, padded_entropy = _actor(_config(), model).compute_log_prob(data, calculate_entropy=True)
    packed_actor = _actor(_config(**chunking), model, use_remove_padding=True)
    packed_actor.varlen_attention = one_row  # all sequences in one row, as under flash-attn's varlen kernel
    for batch in (data, _with_shared_left_padding(data)):
        packed, packed_entropy = packed_actor.compute_log_prob(batch, calculate_entropy=True)
        torch.testing.assert_close(packed[mask], padded[mask], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(packed_entropy[mask], padded_entropy[mask], atol=1e-5, rtol=1e-5)
        assert torch.all(packed[~mask] == 0)


def test_remove_padding_chunking_and_checkpointing_give_the_padded_update(monkeypatch, assert_same_update):
    monkeypatch.setattr("verl.workers.actor.dp_actor.LOGITS_CHUNK", 5)
    model = _model()
    data = _batch(model)
    overrides = {"ppo_micro_batch_size_per_gpu": 3, "use_kl_loss": True, "entropy_coeff": 0.01}
    reference, ref_metrics = _update(model, data, **overrides)
    packed = copy.deepcopy(model)
    actor = _actor(_config(entropy_from_logits_with_chunking=True, entropy_checkpointing=True,
                                         **overrides), packed, torch.optim.SGD(packed.parameters(), lr=1.0),
                                 use_remove_padding=True)
    metrics = actor.update_policy(_with_shared_left_padding(data))
    assert_same_update(packed, metrics, reference, ref_metrics, "actor/grad_norm")
    assert metrics["actor/entropy_loss"] == pytest.approx(ref_metrics["actor/entropy_loss"], rel=1e-5)


@pytest.mark.parametrize("grad_clip, expected", [(None, 1.0), (0.25, 0.25)])
def test_verls_actor_grad_clip_wins_over_optim_clip_grad(grad_clip, expected):
    config = _config()
    config.optim.clip_grad = 1.0
    config.grad_clip = grad_clip
    assert _actor(config, _model()).max_grad_norm == expected


def test_rollout_is_weights_reach_the_policy_loss(monkeypatch):
    model = _model()
    data = _batch(model)
    calls = _spy_on_loss(monkeypatch)
    _update(model, data, policy_loss={"loss_mode": "spy"})
    assert calls[0]["rollout_is_weights"] is None  # no weights in the batch: none passed

    calls.clear()
    weights = torch.rand(6, RESPONSE)
    data.batch["rollout_is_weights"] = weights
    _update(model, data, policy_loss={"loss_mode": "spy"}, ppo_micro_batch_size_per_gpu=2)
    torch.testing.assert_close(torch.cat([call["rollout_is_weights"] for call in calls]), weights)


def test_zero_rollout_is_weights_give_no_policy_gradient():
    model = _model()
    data = _batch(model)
    data.batch["rollout_is_weights"] = torch.zeros(6, RESPONSE)
    updated, metrics = _update(model, data)
    assert metrics["actor/pg_loss"] == [0.0] and metrics["actor/grad_norm"] == [0.0]
    for p_before, p_after in zip(model.parameters(), updated.parameters()):
        assert torch.equal(p_before, p_after)


# ------------------------------------------------------------------ token-mean over data-parallel ranks

# Rows of _batch per rank: 16 valid response tokens on rank 0 (lengths 6, 6, 4), 6 on rank 1 (1, 3, 2).
RANK_ROWS = ([0, 3, 4], [1, 2, 5])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _token_mean_rank(rank: int, world: int, port: int, expected: dict[str, torch.Tensor]):
    from torch.distributed.device_mesh import init_device_mesh

    from verl.utils.fsdp_utils import shard_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:  # an assertion error here fails mp.spawn in the parent
        model = _model()
        data = _batch(model)
        sharded = shard_model(model, init_device_mesh("cpu", (world,)), "cpu")
        actor = _actor(_config(ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=2), sharded,
                                     torch.optim.SGD(sharded.parameters(), lr=1.0))
        actor.update_policy(data.select_idxs(RANK_ROWS[rank]))
        for name, p in sharded.named_parameters():
            torch.testing.assert_close(p.full_tensor(), expected[name], atol=1e-5, rtol=1e-4, msg=name)
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_group()


def test_token_mean_weighs_every_token_of_every_rank_the_same():
    """Two ranks with 16 and 6 tokens: the FSDP update equals one rank's update over all 22 tokens (a mean of the
    per-rank token means would weigh rank 1's tokens 16/6 times more)."""
    model = _model()
    reference, _ = _update(model, _batch(model))  # one rank, all 6 rows in one mini-batch
    expected = {name: p.detach() for name, p in reference.named_parameters()}
    spawn(_token_mean_rank, args=(2, _free_port(), expected), nprocs=2)


@pytest.mark.parametrize("packed, dynamic", [(False, False), (False, True), (True, False)])
def test_compute_log_prob_returns_sum_pi_squared(packed, dynamic, monkeypatch):
    # Against a direct computation from the model's logits at the sampling temperature; chunked, reordered by the
    # dynamic micro-batches, or unpacked from packed rows (0 on padding there).
    monkeypatch.setattr("verl.workers.actor.dp_actor.LOGITS_CHUNK", 4)
    model = _model()
    data = _batch(model)
    data.meta_info.update(micro_batch_size=4, use_dynamic_bsz=dynamic, max_token_len=22)
    actor = _actor(_config(entropy_from_logits_with_chunking=True), model, use_remove_padding=packed)
    log_probs, entropy, sum_pi_squared = actor.compute_log_prob(data, calculate_sum_pi_squared=True)
    assert entropy is None
    with torch.no_grad():
        logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                       position_ids=data.batch["position_ids"]).logits[:, PROMPT - 1 : -1] / 0.7
    expected = (torch.softmax(logits, dim=-1) ** 2).sum(dim=-1)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(sum_pi_squared[mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(log_probs[mask], logprobs_from_logits(logits, data.batch["responses"])[mask],
                               atol=1e-5, rtol=1e-5)
    assert len(actor.compute_log_prob(data)) == 2  # without the flag: (log_probs, entropys) as before


@pytest.mark.parametrize("packed", [False, True])
def test_fused_log_probs_give_the_plain_log_probs_and_entropy(packed, monkeypatch):
    monkeypatch.setattr("verl.workers.actor.dp_actor.FUSED_CHUNK", 4)  # several chunks per micro-batch
    model = _model()
    data = _batch(model)
    data.meta_info.update(micro_batch_size=4, use_dynamic_bsz=False)
    mask = data.batch["response_mask"].bool()
    plain, plain_entropy = _actor(_config(), model).compute_log_prob(data, calculate_entropy=True)
    fused_actor = DataParallelPPOActor(_config(), model, use_remove_padding=packed, fused_logprobs=True)
    for batch in (data, _with_shared_left_padding(data)):
        fused, fused_entropy = fused_actor.compute_log_prob(batch, calculate_entropy=True)
        torch.testing.assert_close(fused[mask], plain[mask], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused_entropy[mask], plain_entropy[mask], atol=1e-5, rtol=1e-5)
        assert fused_actor.compute_log_prob(batch)[1] is None  # no entropy asked: none computed
    # The LM head is back to itself afterwards.
    assert "forward" not in vars(model.get_output_embeddings())


@pytest.mark.parametrize("packed", [False, True])
def test_fused_log_probs_and_activation_offload_give_the_plain_update(packed, monkeypatch, assert_same_update):
    monkeypatch.setattr("verl.workers.actor.dp_actor.FUSED_CHUNK", 5)
    saved_on_host = []
    real_save_on_cpu = torch.autograd.graph.save_on_cpu

    def spy(*args, **kwargs):
        saved_on_host.append(True)
        return real_save_on_cpu(*args, **kwargs)

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", spy)
    model = _model()
    data = _batch(model)
    overrides = {"ppo_micro_batch_size_per_gpu": 3, "use_kl_loss": True, "entropy_coeff": 0.01}
    reference, ref_metrics = _update(model, data, **overrides)
    levered = copy.deepcopy(model)
    cfg = _config(**overrides)
    actor = DataParallelPPOActor(cfg, levered, torch.optim.SGD(levered.parameters(), lr=1.0),
                                 use_remove_padding=packed, batches=_actor(cfg, levered).batches,
                                 fused_logprobs=True, activation_offload=True)
    metrics = actor.update_policy(data)
    assert len(saved_on_host) == 2  # each micro-batch's forward ran with its saved tensors sent to host memory
    assert_same_update(levered, metrics, reference, ref_metrics, "actor/grad_norm")
    assert metrics["actor/entropy_loss"] == pytest.approx(ref_metrics["actor/entropy_loss"], rel=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_offload_sends_the_decoder_layers_saved_tensors_to_the_host_and_keeps_the_heads(
        checkpointing, monkeypatch, assert_same_update):
    """What the decoder layers save for the backward pass goes to the host (with non-reentrant gradient checkpointing:
    each layer's input); from the LM head on nothing does: not its weight, not the logits or their log-softmax (each
    vocabulary-wide). The update is the plain one."""
    offloaded = []

    def recording_save_on_cpu(pin_memory=False):  # the same hooks' stack, recording instead of copying
        return torch.autograd.graph.saved_tensors_hooks(lambda t: offloaded.append(tuple(t.shape)) or t, lambda t: t)

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", recording_save_on_cpu)
    model = _model()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    data = _batch(model)
    reference, ref_metrics = _update(model, data, ppo_micro_batch_size_per_gpu=3)
    levered = copy.deepcopy(model)
    cfg = _config(ppo_micro_batch_size_per_gpu=3)
    actor = DataParallelPPOActor(cfg, levered, torch.optim.SGD(levered.parameters(), lr=1.0),
                                 use_remove_padding=False, batches=_actor(cfg, levered).batches,
                                 activation_offload=True)
    metrics = actor.update_policy(data)
    hidden = model.config.hidden_size
    assert any(shape[-1] == hidden and len(shape) == 3 for shape in offloaded)  # the layers' activations
    assert not [shape for shape in offloaded if VOCAB in shape]  # the head's weight, the logits
    assert_same_update(levered, metrics, reference, ref_metrics, "actor/grad_norm")


def test_compiled_layers_give_the_eager_update(assert_same_update):
    from verl.utils.fsdp_utils import compile_layers

    model = _model()
    data = _batch(model)
    reference, ref_metrics = _update(model, data, ppo_micro_batch_size_per_gpu=3)
    compiled = copy.deepcopy(model)
    compile_layers(compiled)
    cfg = _config(ppo_micro_batch_size_per_gpu=3)
    actor = _actor(cfg, compiled, torch.optim.SGD(compiled.parameters(), lr=1.0))
    metrics = actor.update_policy(data)
    assert all(hasattr(layer, "_compiled_call_impl") and layer._compiled_call_impl is not None
               for layer in compiled.model.layers)
    assert_same_update(compiled, metrics, reference, ref_metrics, "actor/grad_norm")


def test_a_bf16_reference_gives_the_kl_of_the_float32_one_within_bf16_rounding():
    """ref.fsdp_config.model_dtype=bf16: the reference's log-probs come from bf16 weights (and bf16 compute on CPU);
    the KL penalty of the actor against it is the float32 reference's within bf16 rounding."""
    from verl.algorithms.kl import kl_penalty

    model = _model()
    data = _batch(model)
    data.meta_info.update(micro_batch_size=3, use_dynamic_bsz=False)
    mask = data.batch["response_mask"].bool()
    actor = torch.nn.Module.to(copy.deepcopy(model), torch.float32)
    with torch.no_grad():  # the actor moved away from the reference a little
        for p in actor.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.02)
    log_prob, _ = _actor(_config(), actor).compute_log_prob(data)
    ref32, _ = _actor(_config(), model).compute_log_prob(data)
    ref16, _ = _actor(_config(), copy.deepcopy(model).to(torch.bfloat16)).compute_log_prob(data)
    assert ref16.dtype == torch.float32  # log-probs in float32 whatever the weights
    assert (ref16 - ref32)[mask].abs().max() < 0.05  # bf16 keeps 8 bits of mantissa
    for kind in ("low_var_kl", "kl"):
        kl32, kl16 = (kl_penalty(log_prob, ref, kind)[mask].mean().item() for ref in (ref32, ref16))
        assert kl16 == pytest.approx(kl32, abs=0.01), kind



@pytest.mark.parametrize("overrides", [{}, {"ppo_micro_batch_size_per_gpu": 2}])
def test_decoupled_weights_made_in_the_update_equal_the_ones_made_before_it(overrides):
    """An on-policy-shaped update without old log-probs and with meta_info decoupled_is_threshold=C makes decoupled
    PPO's weight w = min(pi_prox / pi_behav, C) from its own detached log-probs (the weights before the update): the
    update the recomputed log-probs and the weights made before the update give."""
    from verl.algorithms.primitives import truncated_is_weights

    model = _model()
    data = _batch(model)
    mask = data.batch["response_mask"]
    actor = _actor(_config(**overrides), model)
    proximal, _ = actor.compute_log_prob(data)
    torch.manual_seed(2)
    behaviour = (proximal + 0.4 * torch.randn_like(proximal)) * mask  # the engine that sampled, some versions back
    weights = truncated_is_weights(proximal, behaviour, mask, 1.5)
    assert 0 < float(weights[mask.bool()].min()) and float(weights.max()) == 1.5  # some weights truncated
    tensors = {k: v for k, v in data.batch.items() if k != "old_log_probs"}
    before = DataProto.from_dict(tensors={**tensors, "old_log_probs": proximal, "rollout_is_weights": weights},
                                 meta_info=data.meta_info)
    inside = DataProto.from_dict(tensors={**tensors, "rollout_log_probs": behaviour},
                                 meta_info={**data.meta_info, "decoupled_is_threshold": 1.5})
    model_a, metrics_a = _update(model, before, **overrides)
    model_b, metrics_b = _update(model, inside, **overrides)
    assert metrics_a["actor/pg_loss"] == pytest.approx(metrics_b["actor/pg_loss"], abs=1e-6)
    assert any((p - q).abs().max() > 1e-4 for p, q in zip(model.parameters(), model_b.parameters()))
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    means = metrics_b["actor/decoupled_is_weight_mean"]  # one per micro-batch
    assert all(0 < m <= 1.5 for m in means)
    if not overrides:
        assert means == [pytest.approx(float(weights.sum() / mask.sum()), rel=1e-5)]


def test_truncated_is_weights_by_hand():
    from verl.algorithms.primitives import truncated_is_weights

    proximal = torch.log(torch.tensor([[0.5, 0.4, 0.9]]))
    behaviour = torch.log(torch.tensor([[0.25, 0.4, 0.3]]))
    weights = truncated_is_weights(proximal, behaviour, torch.tensor([[1, 1, 0]]), threshold=1.5)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 1.0, 0.0]]))  # 2 truncated to 1.5; masked: 0


def test_without_an_old_log_prob_pass_the_update_measures_the_rollout_gap_on_its_first_mini_batch():
    """old_log_prob_source != recompute: the update's forward on its first mini-batch (the weights that sampled it)
    gives the rollout-actor gap sums; the later mini-batches, after an optimizer step, give none."""
    from verl.utils.rollout_gap import gap_metrics, gap_sums, pop_worker_sums

    model = _model()
    data = _batch(model)
    rollout = data.batch["old_log_probs"].clone()
    data.batch["rollout_log_probs"] = rollout
    data.meta_info["old_log_prob_source"] = "rollout"
    _, metrics = _update(model, data, ppo_mini_batch_size=3)
    assert len(metrics["actor/grad_norm"]) == 2
    measured = gap_metrics(pop_worker_sums(metrics))
    with torch.no_grad():
        logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                       position_ids=data.batch["position_ids"]).logits[:, PROMPT - 1: -1] / 0.7
    actor = logprobs_from_logits(logits, data.batch["responses"])
    first = gap_metrics(gap_sums(rollout[:3], actor[:3], data.batch["response_mask"][:3]))
    assert measured["training/rollout_gap_tokens"] == first["training/rollout_gap_tokens"] == 6 + 1 + 3
    for key in first:
        assert measured[key] == pytest.approx(first[key], rel=1e-4, abs=1e-6), key
    data.meta_info["old_log_prob_source"] = "recompute"  # the driver measured it in the pass
    _, metrics = _update(model, data, ppo_mini_batch_size=3)
    assert pop_worker_sums(metrics) is None
