"""Chunked and checkpointed log-probs/entropy equal the plain computation, values and gradients."""

import math

import pytest
import torch

from verl.utils.torch_functional import entropy_from_logits, logprobs_and_entropy, logprobs_from_logits


def test_log_prob_and_entropy_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    log_prob, entropy = logprobs_and_entropy(logits, torch.tensor([1]), with_entropy=True)
    assert log_prob.item() == pytest.approx(math.log(0.75))
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    half, _ = logprobs_and_entropy(logits, torch.tensor([1]), temperature=2.0)  # z/2: probabilities 1:sqrt(3)
    assert half.item() == pytest.approx(math.log(math.sqrt(3) / (1 + math.sqrt(3))))


@pytest.mark.parametrize("chunk_size,checkpoint", [(None, False), (3, False), (3, True), (100, True)])
def test_chunks_and_checkpointing_give_the_plain_values_and_gradients(chunk_size, checkpoint):
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 11, requires_grad=True)
    labels = torch.randint(0, 11, (2, 7))
    weights = torch.randn(2, 7)
    z = logits / 0.7
    plain_lp, plain_ent = logprobs_from_logits(z, labels), entropy_from_logits(z)
    plain_grad, = torch.autograd.grad((weights * plain_lp).sum() + plain_ent.sum(), logits)
    log_prob, entropy = logprobs_and_entropy(logits, labels, 0.7, True, chunk_size=chunk_size, checkpoint=checkpoint)
    grad, = torch.autograd.grad((weights * log_prob).sum() + entropy.sum(), logits)
    torch.testing.assert_close(log_prob, plain_lp)
    torch.testing.assert_close(entropy, plain_ent)
    torch.testing.assert_close(grad, plain_grad)


def test_sum_pi_squared_by_hand_and_in_chunks():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4: 1/16 + 9/16
    _, entropy, sum_pi_squared = logprobs_and_entropy(logits, torch.tensor([1]), with_sum_pi_squared=True)
    assert entropy is None and sum_pi_squared.item() == pytest.approx(10 / 16)
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 7, 11), torch.randint(0, 11, (2, 7))
    expected = (torch.softmax(logits / 0.7, dim=-1) ** 2).sum(dim=-1)
    log_prob, entropy, sum_pi_squared = logprobs_and_entropy(logits, labels, 0.7, True, chunk_size=3,
                                                             with_sum_pi_squared=True)
    torch.testing.assert_close(sum_pi_squared, expected)
    torch.testing.assert_close(entropy, entropy_from_logits(logits / 0.7))
    torch.testing.assert_close(log_prob, logprobs_from_logits(logits / 0.7, labels))


def test_tensor_checksum_is_the_sum_and_the_same_bits_whatever_the_threads():
    from verl.utils.torch_functional import tensor_checksum

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3000, 896, generator=generator)
    exact = float(weight.sum(dtype=torch.float64))
    assert float(tensor_checksum(weight)) == pytest.approx(exact, rel=1e-6, abs=1e-3)
    assert tensor_checksum(weight).dtype == torch.float64
    threads = torch.get_num_threads()
    try:
        sums = set()
        for n in (1, 2):
            torch.set_num_threads(n)
            sums.add(float(tensor_checksum(weight)))
        assert len(sums) == 1  # one row per thread: the thread count does not change the bits
    finally:
        torch.set_num_threads(threads)
    assert float(tensor_checksum(torch.tensor(2.5))) == 2.5
    assert float(tensor_checksum(torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16))) == 10.0
    assert float(tensor_checksum(weight.reshape(-1))) == pytest.approx(exact, rel=1e-6, abs=1e-3)  # one long row
