"""RewardModelWorker on one process (world size 1, gloo) and on two: its scores are those of a plain Hugging Face
forward of the tiny reward model on the same text, put on each response's last valid token; the re-templating path
(a reward model with another tokenizer and chat template) and the truncation to reward_model.max_length."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import leave_group, spawn
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from verl.protocol import DataProto
from verl.trainer.config import load_config
from verl.trainer.ppo.run_plan import plan_run
from verl.utils.torch_functional import compute_position_id_with_mask
from verl.workers.reward_model_worker import RewardModelWorker, retemplate

PROMPT_LEN, RESPONSE_LEN = 32, 12
CONVERSATIONS = [  # (chat messages, response text, whether the response ends in EOS)
    ([{"role": "user", "content": "What is 2 + 3?"}], "The answer is 5.", True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7 + 4?"}], "11", True),
    ([{"role": "user", "content": "Say something about the sun."}], "The sun is warm in the afternoon", False),
    ([{"role": "user", "content": "Count to three."}], "", False),
]
# With two short rows, ordered so that the first three rows (one rank's share, or one micro-batch of 3) pack two
# sequences into one row with use_remove_padding: token lengths 30, 15, 13, 13, 23, 26.
MIXED = [CONVERSATIONS[1], CONVERSATIONS[3], ([{"role": "user", "content": "Hi"}], "ok", True),
         ([{"role": "user", "content": "2+2"}], "4", True), CONVERSATIONS[0], CONVERSATIONS[2]]


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    """The workers of this module join one gloo group of one rank, left at the end so other tests can make theirs."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def make_worker(rm_dir: str, policy_dir: str | None, *overrides: str) -> RewardModelWorker:
    """A worker of one rank; `policy_dir` None: no input_tokenizer."""
    policy = f"actor_rollout_ref.model.path={policy_dir}" if policy_dir else "reward_model.model.input_tokenizer=null"
    config = load_config(overrides=[policy, "reward_model.enable=true", f"reward_model.model.path={rm_dir}",
                                    *overrides])
    worker = RewardModelWorker(config.reward_model, plan=plan_run(config, "cpu"))
    worker.init_model()
    return worker


def encode_prompt(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def encode_response(tokenizer, response: str, eos: bool) -> list[int]:
    return tokenizer.encode(response, add_special_tokens=False) + ([tokenizer.eos_token_id] if eos else [])


def make_batch(tokenizer, conversations=CONVERSATIONS, raw_chat=True) -> DataProto:
    """The batch the trainer has after generation: left-padded prompts, right-padded responses."""
    n, pad = len(conversations), tokenizer.pad_token_id
    prompts, responses = torch.full((n, PROMPT_LEN), pad), torch.full((n, RESPONSE_LEN), pad)
    attention_mask = torch.zeros(n, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    for i, (messages, response, eos) in enumerate(conversations):
        prompt_ids, response_ids = encode_prompt(tokenizer, messages), encode_response(tokenizer, response, eos)
        prompts[i, PROMPT_LEN - len(prompt_ids):] = torch.tensor(prompt_ids)
        attention_mask[i, PROMPT_LEN - len(prompt_ids): PROMPT_LEN + len(response_ids)] = 1
        if response_ids:
            responses[i, : len(response_ids)] = torch.tensor(response_ids)
    input_ids = torch.cat([prompts, responses], dim=1)
    non_tensors = {}
    if raw_chat:  # data.return_raw_chat=true: each row's chat messages
        non_tensors["raw_prompt"] = np.empty(n, dtype=object)
        non_tensors["raw_prompt"][:] = [messages for messages, _, _ in conversations]
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "input_ids": input_ids, "attention_mask": attention_mask,
                 "position_ids": compute_position_id_with_mask(attention_mask)},
        non_tensors=non_tensors)


def hf_scores(rm_dir: str, id_lists: list[list[int]]) -> torch.Tensor:
    """The reward model's score of each id list, one plain unpadded forward each."""
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir)
    with torch.no_grad():
        return torch.tensor([model(input_ids=torch.tensor([ids])).logits[0, 0].item() for ids in id_lists])


def last_response_token(batch: DataProto) -> torch.Tensor:
    lengths = batch.batch["attention_mask"][:, PROMPT_LEN:].sum(-1)
    return (lengths - 1).clamp(min=0)


def placed(batch: DataProto, scores: torch.Tensor) -> torch.Tensor:
    expected = torch.zeros(len(batch), RESPONSE_LEN)
    expected[torch.arange(len(batch)), last_response_token(batch)] = scores
    return expected


def test_scores_are_a_plain_forward_of_the_policy_tokens_on_the_last_response_token(tiny_model_dir,
                                                                                    tiny_reward_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    worker = make_worker(tiny_reward_model_dir, tiny_model_dir)
    assert worker.input_tokenizer is None  # the same tokenizer: the policy's tokens are read as they are
    batch = make_batch(tokenizer)
    out = worker.compute_rm_score(batch)
    ids = [encode_prompt(tokenizer, m) + encode_response(tokenizer, r, eos) for m, r, eos in CONVERSATIONS]
    expected = hf_scores(tiny_reward_model_dir, ids)
    rm_scores = out.batch["rm_scores"]
    assert rm_scores.shape == (len(CONVERSATIONS), RESPONSE_LEN) and rm_scores.dtype == torch.float32
    torch.testing.assert_close(rm_scores, placed(batch, expected), rtol=1e-5, atol=1e-5)
    assert (rm_scores != 0).sum() == len(CONVERSATIONS)  # one score per row; the empty response's on position 0
    assert last_response_token(batch)[-1] == 0
    assert out.meta_info["metrics"] == {"reward_model/truncated_fraction": [0.0]}


def test_a_sequence_ending_in_the_pad_token_is_scored_on_that_token(tiny_model_dir, tiny_reward_model_dir):
    """HF's classifier pools at the last non-pad token; the worker reads the last valid one."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    worker = make_worker(tiny_reward_model_dir, tiny_model_dir)
    batch = make_batch(tokenizer, CONVERSATIONS[:2])
    row_end = PROMPT_LEN + int(batch.batch["attention_mask"][0, PROMPT_LEN:].sum())
    batch.batch["input_ids"][0, row_end] = tokenizer.pad_token_id  # one more response token: the pad token
    batch.batch["responses"][0, row_end - PROMPT_LEN] = tokenizer.pad_token_id
    batch.batch["attention_mask"][0, row_end] = 1
    ids = batch.batch["input_ids"][0][batch.batch["attention_mask"][0].bool()]
    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_dir)
    with torch.no_grad():
        expected = model.score(model.model(input_ids=ids[None]).last_hidden_state)[0, -1, 0]
    score = worker.compute_rm_score(batch).batch["rm_scores"][0, row_end - PROMPT_LEN]
    torch.testing.assert_close(score, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [["reward_model.micro_batch_size_per_gpu=1"],
                                       ["reward_model.use_dynamic_bsz=true",
                                        "reward_model.forward_max_token_len_per_gpu=40"],
                                       ["reward_model.model.use_remove_padding=true"],
                                       ["reward_model.model.use_remove_padding=true",
                                        "reward_model.micro_batch_size_per_gpu=3"]],
                         ids=["one_row_each", "dynamic_bsz", "remove_padding", "remove_padding_micro"])
def test_micro_batches_and_packing_give_the_same_scores(tiny_model_dir, tiny_reward_model_dir, overrides):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = make_batch(tokenizer, MIXED)
    whole = make_worker(tiny_reward_model_dir, tiny_model_dir).compute_rm_score(batch).batch["rm_scores"]
    split = make_worker(tiny_reward_model_dir, tiny_model_dir, *overrides).compute_rm_score(batch).batch["rm_scores"]
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)


def test_another_tokenizer_gets_the_conversation_in_its_own_chat_template(tiny_model_dir,
                                                                          other_tokenizer_reward_model_dir):
    policy = AutoTokenizer.from_pretrained(tiny_model_dir)
    rm_tokenizer = AutoTokenizer.from_pretrained(other_tokenizer_reward_model_dir)
    worker = make_worker(other_tokenizer_reward_model_dir, tiny_model_dir)
    assert worker.input_tokenizer is not None
    batch = make_batch(policy)
    ids = [retemplate(messages, response, rm_tokenizer) for messages, response, _ in CONVERSATIONS]
    assert rm_tokenizer.decode(ids[1]).startswith("### system:\nBe brief.<|im_end|>\n### user:\nWhat is 7 + 4?")
    assert rm_tokenizer.decode(ids[1]).endswith("### assistant:\n11<|im_end|>\n")  # the policy's EOS decoded away
    expected = hf_scores(other_tokenizer_reward_model_dir, ids)
    torch.testing.assert_close(worker.compute_rm_score(batch).batch["rm_scores"], placed(batch, expected),
                               rtol=1e-5, atol=1e-5)


def test_without_raw_prompt_the_decoded_prompt_is_one_user_message(tiny_model_dir, other_tokenizer_reward_model_dir):
    policy = AutoTokenizer.from_pretrained(tiny_model_dir)
    rm_tokenizer = AutoTokenizer.from_pretrained(other_tokenizer_reward_model_dir)
    worker = make_worker(other_tokenizer_reward_model_dir, tiny_model_dir)
    batch = make_batch(policy, CONVERSATIONS[:1], raw_chat=False)
    messages, response, _ = CONVERSATIONS[0]
    text = policy.decode(encode_prompt(policy, messages), skip_special_tokens=True)
    assert text == "user\nWhat is 2 + 3?\nassistant\n"
    expected = hf_scores(other_tokenizer_reward_model_dir,
                         [retemplate([{"role": "user", "content": text}], response, rm_tokenizer)])
    torch.testing.assert_close(worker.compute_rm_score(batch).batch["rm_scores"], placed(batch, expected),
                               rtol=1e-5, atol=1e-5)


def test_max_length_keeps_the_last_tokens(tiny_model_dir, other_tokenizer_reward_model_dir):
    policy = AutoTokenizer.from_pretrained(tiny_model_dir)
    rm_tokenizer = AutoTokenizer.from_pretrained(other_tokenizer_reward_model_dir)
    ids = [retemplate(messages, response, rm_tokenizer) for messages, response, _ in CONVERSATIONS]
    max_length = 28
    assert sorted(len(i) > max_length for i in ids) == [False, True, True, True]
    worker = make_worker(other_tokenizer_reward_model_dir, tiny_model_dir, f"reward_model.max_length={max_length}")
    batch = make_batch(policy)
    out = worker.compute_rm_score(batch)
    expected = hf_scores(other_tokenizer_reward_model_dir, [i[-max_length:] for i in ids])
    torch.testing.assert_close(out.batch["rm_scores"], placed(batch, expected), rtol=1e-5, atol=1e-5)
    assert out.meta_info["metrics"] == {"reward_model/truncated_fraction": [0.75]}


def test_policy_tokens_outside_the_reward_models_vocabulary_are_refused(tiny_model_dir,
                                                                        other_tokenizer_reward_model_dir):
    worker = make_worker(other_tokenizer_reward_model_dir, None)  # no input_tokenizer: the tokens as they are
    batch = make_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    batch.batch["input_ids"][0, -RESPONSE_LEN] = worker.vocab_rows + 5
    batch.batch["attention_mask"][0, -RESPONSE_LEN] = 1
    with pytest.raises(ValueError, match="set reward_model.model.input_tokenizer"):
        worker.compute_rm_score(batch)


# ------------------------------------------------------------------------------------------------ two ranks
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, port: int, policy_dir: str, rm_dir: str, results):
    import os

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        # dynamic bsz: the ranks agree on the number of micro-batches, whose forwards gather the FSDP shards
        worker = make_worker(rm_dir, policy_dir, "reward_model.use_dynamic_bsz=true",
                             "reward_model.forward_max_token_len_per_gpu=40",
                             "reward_model.model.use_remove_padding=true")
        batch = make_batch(AutoTokenizer.from_pretrained(policy_dir), MIXED)
        share = batch.chunk(2)[rank]  # what DP_COMPUTE_PROTO hands this rank
        results[rank] = worker.compute_rm_score(share).batch["rm_scores"]
    except Exception as err:  # reported to the parent
        results[rank] = repr(err)
        if dist.is_initialized():
            dist.destroy_process_group()
        return
    leave_group()


def test_two_ranks_score_as_one(tiny_model_dir, tiny_reward_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = make_batch(tokenizer, MIXED)
    expected = make_worker(tiny_reward_model_dir, tiny_model_dir).compute_rm_score(batch).batch["rm_scores"]
    results = mp.Manager().dict()
    spawn(_rank, args=(_free_port(), tiny_model_dir, tiny_reward_model_dir, results), nprocs=2)
    assert all(isinstance(results[r], torch.Tensor) for r in range(2)), dict(results)
    torch.testing.assert_close(torch.cat([results[0], results[1]]), expected, rtol=1e-5, atol=1e-5)
