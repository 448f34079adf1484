"""Ulysses sequence parallelism in the actor and the critic (dp_actor / dp_critic with `sp_group`): two gloo ranks
forming one group, the models sharded with FSDP2 over them, give the single-process log-probs, entropies, values
and updates -- padded rows and packed rows (use_remove_padding), the plain and the fused LM head, with gradient
checkpointing. One pair of processes runs every case."""

import copy
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import leave_group, spawn
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from verl.protocol import DataProto
from verl.single_controller.base.worker import find_free_port
from verl.utils.run_plan import MicroBatches, UpdateBatches
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.critic.dp_critic import DataParallelPPOCritic

PROMPT, RESPONSE, VOCAB = 5, 6, 61


def _config(heads: int = 4):
    return Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=heads,
                       num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                       attn_implementation="sdpa", pad_token_id=0)


def _actor_config():
    return OmegaConf.create({
        "ppo_mini_batch_size": 6, "ppo_micro_batch_size_per_gpu": 3, "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 1000, "ppo_epochs": 1, "shuffle": False, "clip_ratio": 0.2,
        "clip_ratio_low": None, "clip_ratio_high": None, "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean",
        "entropy_coeff": 0.01, "use_kl_loss": False, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl",
        "policy_loss": {"loss_mode": "vanilla"}, "optim": {"clip_grad": 1e9}, "cliprange_value": 0.5,
    })


def _batch() -> DataProto:
    """6 rows: prompts left-padded (5 columns), responses right-padded (6 columns), of odd real lengths."""
    gen = torch.Generator().manual_seed(1)
    prompt_lens, response_lens = [5, 3, 4, 5, 2, 1], [6, 1, 3, 5, 4, 2]
    attention = torch.zeros(6, PROMPT + RESPONSE, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attention[i, PROMPT - p : PROMPT + r] = 1
    input_ids = torch.randint(3, VOCAB, (6, PROMPT + RESPONSE), generator=gen) * attention
    responses = input_ids[:, PROMPT:]
    response_mask = attention[:, PROMPT:]
    return DataProto.from_dict(tensors={
        "input_ids": input_ids, "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0), "responses": responses,
        "response_mask": response_mask, "old_log_probs": -2.0 - torch.rand(6, RESPONSE, generator=gen),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])[:, None] * response_mask,
        "values": torch.randn(6, RESPONSE, generator=gen) * response_mask,
        "returns": torch.randn(6, RESPONSE, generator=gen) * response_mask,
    }, meta_info={"temperature": 0.7})


def _micro(dynamic: bool) -> MicroBatches:
    """3 sequences per micro-batch, or with `dynamic` a budget of 24 tokens (use_dynamic_bsz)."""
    return MicroBatches(None, 24, "budget") if dynamic else MicroBatches(3, None, "micro")


def _run(module, sp_group, packed, fused, critic=False, dynamic=False):
    """Log-probs and entropy (or values), then one update with SGD(lr=1): (outputs..., full updated weights)."""
    data = _batch()
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    if critic:
        worker = DataParallelPPOCritic(_actor_config(), module, optimizer, use_remove_padding=packed,
                                       batches=UpdateBatches(6, _micro(dynamic)), forward=_micro(dynamic),
                                       sp_group=sp_group)
        outputs = (worker.compute_values(data),)
        worker.update_critic(data)
    else:
        worker = DataParallelPPOActor(_actor_config(), module, optimizer, use_remove_padding=packed,
                                      fused_logprobs=fused, batches=UpdateBatches(6, _micro(dynamic)),
                                      log_prob=_micro(dynamic), sp_group=sp_group)
        outputs = worker.compute_log_prob(data, calculate_entropy=True)
        worker.update_policy(data)
    full = {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
            for name, t in module.state_dict().items()}
    return [o.detach().clone() for o in outputs], full


# (name, use_remove_padding, fused log-probs, critic, use_dynamic_bsz)
CASES = [("padded", False, False, False, False), ("packed", True, False, False, False),
         ("packed_fused", True, True, False, False), ("padded_fused", False, True, False, False),
         ("packed_dynamic", True, False, False, True), ("critic_padded", False, False, True, False),
         ("critic_packed_dynamic", True, False, True, True)]


def _ranks(rank: int, port: int, results) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from verl.utils.fsdp_utils import shard_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    try:
        for name, packed, fused, critic, dynamic in CASES:
            torch.manual_seed(0)
            base = Qwen2ForTokenClassification(_config()) if critic else Qwen2ForCausalLM(_config())
            if critic:  # a scalar value head without dropout, as CriticWorker builds it
                base.config.num_labels = 1
                base.score = torch.nn.Linear(32, 1)
                base.dropout.p = 0.0
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            plain = copy.deepcopy(base)
            expected, expected_weights = _run(plain, None, packed, fused, critic, dynamic)  # one process, whole rows
            sharded = shard_model(copy.deepcopy(base), init_device_mesh("cpu", (2,)), "cpu")
            got, weights = _run(sharded, group, packed, fused, critic, dynamic)
            mask = _batch().batch["response_mask"].bool()  # padding positions are the model's to fill
            for a, b in zip(got, expected, strict=True):
                torch.testing.assert_close(a[mask], b[mask], atol=1e-5, rtol=1e-5)
            for key, value in expected_weights.items():
                torch.testing.assert_close(weights[key], value, atol=1e-5, rtol=1e-4, msg=f"{name}: {key}")
            results[(rank, name)] = "ok"
    except Exception:  # reported to the parent
        results[(rank, "error")] = traceback.format_exc()
        dist.destroy_process_group()
        return
    leave_group()


@pytest.fixture(scope="module")
def two_rank_results():
    results = mp.Manager().dict()
    spawn(_ranks, args=(find_free_port(), results), nprocs=2)
    return dict(results)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_sequence_parallel_passes_and_updates_equal_the_whole_rows(two_rank_results, case):
    assert "error" not in {name for _, name in two_rank_results}, two_rank_results
    assert two_rank_results[(0, case)] == two_rank_results[(1, case)] == "ok"


def test_the_dispatch_gives_a_groups_ranks_one_chunk_and_collects_one_output_per_group():
    from verl.single_controller.base.decorator import Dispatch

    class Group:
        world_size, sequence_parallel = 4, 2

    data = DataProto.from_dict(tensors={"x": torch.arange(6)})
    args, kwargs = Dispatch.DP_SP_COMPUTE_PROTO.dispatch_fn(Group(), data, flag=True)
    chunks = args[0]
    assert [c.batch["x"].tolist() for c in chunks] == [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]]
    assert kwargs["flag"] == [True] * 4
    collected = Dispatch.DP_SP_COMPUTE_PROTO.collect_fn(Group(), chunks)
    assert collected.batch["x"].tolist() == list(range(6))
    Group.sequence_parallel = 1  # without sequence parallelism: DP_COMPUTE_PROTO's split
    assert len(Dispatch.DP_SP_COMPUTE_PROTO.dispatch_fn(Group(), DataProto.from_dict(tensors={"x": torch.arange(8)}))[0][0]) == 4
