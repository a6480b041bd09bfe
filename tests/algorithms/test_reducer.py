"""Reducer R: hand values, and micro-batch additivity in both modes."""

from __future__ import annotations

import pytest
import torch

from miles_core.algorithms import Reducer


X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_default_mode_hand_value():
    # per-sample means: (1+2)/2 = 1.5, 4/1 = 4, empty -> 0; global batch size 4 -> (1.5 + 4 + 0) / 4 = 1.375
    assert Reducer(False, num_samples=4, num_tokens=99)(X, M).item() == pytest.approx(1.375)


def test_per_token_mode_hand_value():
    # (1 + 2 + 4) / num_tokens 6 = 7/6 (num_tokens is the whole step's, not this micro-batch's 3)
    assert Reducer(True, num_samples=4, num_tokens=6)(X, M).item() == pytest.approx(7 / 6)


def test_share_and_per_sample():
    r = Reducer(False, num_samples=4, num_tokens=6)
    assert r.share(M).item() == pytest.approx(2 / 4)  # two non-empty samples of 4
    # per-sample values [10, 20, 30] -> (10 + 20) / 4; per-token: 10 * 2 + 20 * 1 over 6 tokens
    assert r.per_sample(torch.tensor([10.0, 20.0, 30.0]), M).item() == pytest.approx(7.5)
    assert Reducer(True, 4, 6).per_sample(torch.tensor([10.0, 20.0, 30.0]), M).item() == pytest.approx(40 / 6)


def test_invalid_batch_size():
    with pytest.raises(ValueError, match="num_samples"):
        Reducer(False, 0, 1)


@pytest.mark.parametrize("per_token", [False, True])
def test_micro_batches_sum_to_full_batch(per_token, batch):
    n = batch.mask.shape[0]
    x = batch.logp
    reduce = Reducer(per_token, num_samples=n, num_tokens=batch.mask.sum().item())
    full = reduce(x, batch.mask)
    parts = sum(reduce(x[i : i + 3], batch.mask[i : i + 3]) for i in range(0, n, 3))
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)
    # loop reference
    if per_token:
        ref = sum(x[i, t].item() * batch.mask[i, t].item() for i in range(n) for t in range(x.shape[1]))
        ref /= batch.mask.sum().item()
    else:
        ref = 0.0
        for i in range(n):
            count = batch.mask[i].sum().item()
            ref += sum(x[i, t].item() * batch.mask[i, t].item() for t in range(x.shape[1])) / max(count, 1)
        ref /= n
    assert full.item() == pytest.approx(ref, rel=1e-5)
