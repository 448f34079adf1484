"""The weight package of separate_async's push: host arrays in one stored object, a checksum per tensor, and a
corrupted arrival refused before anything is loaded."""

import copy

import pytest
import torch

from verl.workers.rollout.weight_package import WeightChecksumError, pack_weights, unpack_weights


def _stored(items, version=3):
    store = []
    # ray.put serialises the object into the store at once: a copy, as the stand-in makes
    package = pack_weights(items, version, put=lambda obj: store.append(copy.deepcopy(obj)) or len(store) - 1)
    return package, store[package.ref[0]]


def test_a_package_round_trips_every_dtype_bit_for_bit():
    torch.manual_seed(0)
    items = [("a.weight", torch.randn(3, 5)), ("b.bias", torch.randn(4, dtype=torch.bfloat16)),
             ("c.weight", torch.randn(2, 2, dtype=torch.float16)), ("d.count", torch.tensor(7))]
    package, arrays = _stored(items)
    assert package.version == 3 and package.dtypes["b.bias"] == "bfloat16"
    out = dict(unpack_weights(package, arrays))
    for name, tensor in items:
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor), name


def test_the_checksum_is_taken_of_what_is_sent():
    """Changing the live tensor after packing changes nothing: the store holds its own copy."""
    weight = torch.ones(4, 4)
    package, arrays = _stored([("w", weight)])
    weight.add_(1.0)
    assert torch.equal(dict(unpack_weights(package, arrays))["w"], torch.ones(4, 4))


def test_a_corrupted_tensor_is_refused_naming_it():
    package, arrays = _stored([("ok", torch.zeros(8)), ("hit", torch.arange(16, dtype=torch.float32).view(4, 4))])
    arrays = {name: array.copy() for name, array in arrays.items()}
    arrays["hit"][2, 1] += 1e-3  # one value off
    with pytest.raises(WeightChecksumError, match="arrived corrupted: tensor 'hit'.*not loaded"):
        unpack_weights(package, arrays)


def test_a_package_with_other_tensors_is_refused():
    package, arrays = _stored([("a", torch.zeros(2)), ("b", torch.zeros(2))])
    with pytest.raises(WeightChecksumError, match="missing \\['b'\\]"):
        unpack_weights(package, {"a": arrays["a"]})
