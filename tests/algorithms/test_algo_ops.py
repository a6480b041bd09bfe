"""Masked helpers and KL estimators: hand values and loop-vs-vectorised checks."""

from __future__ import annotations

import math

import pytest
import torch

from miles_core.algorithms import KL_ESTIMATORS, entropy_from_logits, kl_estimate, masked_mean, masked_whiten
from miles_core.algorithms.ops import discounted_cumsum, last_token_mask, sequence_mean


def test_masked_mean_hand_values():
    x = torch.tensor([[1.0, 2.0, 30.0], [4.0, 50.0, 60.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # all: (1 + 2 + 4) / 3 = 7/3; per row: (1+2)/2 = 1.5 and 4/1 = 4; per column: (1+4)/2, 2/1, 0/max(0,1)
    assert masked_mean(x, m).item() == pytest.approx(7 / 3)
    assert masked_mean(x, m, dim=-1).tolist() == pytest.approx([1.5, 4.0])
    assert masked_mean(x, m, dim=0).tolist() == pytest.approx([2.5, 2.0, 0.0])
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0


def test_masked_whiten_hand_values():
    x = torch.tensor([[1.0, 3.0], [99.0, 5.0]])
    m = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    # mean (1+3+5)/3 = 3; population var (4+0+4)/3 = 8/3; out = (x-3)/sqrt(8/3 + 1e-8), 0 where masked out
    s = math.sqrt(8 / 3 + 1e-8)
    expected = [[-2 / s, 0.0], [0.0, 2 / s]]
    assert masked_whiten(x, m).tolist() == [pytest.approx(r) for r in expected]


def test_last_token_mask_and_sequence_mean():
    m = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert last_token_mask(m).tolist() == [[0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
    x = torch.tensor([[2.0, 100.0, 4.0, 100.0], [1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    assert sequence_mean(x, m).tolist() == pytest.approx([3.0, 2.5, 0.0])


def test_discounted_cumsum_loop():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, generator=g)
    gamma = 0.7
    out = discounted_cumsum(x, gamma)
    for i in range(3):
        for t in range(6):
            ref = sum(gamma ** (s - t) * x[i, s].item() for s in range(t, 6))
            assert out[i, t].item() == pytest.approx(ref, abs=1e-5)


def test_entropy_from_logits():
    # uniform over 4 -> log 4; one-hot-ish [0, -inf-like] -> ~0; [log 1, log 3] -> p = (1/4, 3/4)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, -1e4, -1e4, -1e4]], [[0.0, math.log(3), -1e4, -1e4]] * 2])
    h = entropy_from_logits(logits)
    p = [0.25, 0.75]
    h_two = -sum(q * math.log(q) for q in p)  # 0.5623351
    assert h.shape == (2, 2)
    assert h.tolist() == [pytest.approx([math.log(4), 0.0], abs=1e-6), pytest.approx([h_two, h_two], abs=1e-6)]


def test_kl_estimators_hand_values():
    logp = torch.tensor([[-1.0, -2.0]])
    base = torch.tensor([[-1.5, -1.0]])
    # d = logp - base = [0.5, -1.0]
    assert kl_estimate(logp, base, "k1")[0].tolist() == pytest.approx([0.5, -1.0])
    assert kl_estimate(logp, base, "k2")[0].tolist() == pytest.approx([0.125, 0.5])  # d^2/2
    # k3 = exp(-d) - 1 + d: exp(-0.5) - 0.5 = 0.1065307; exp(1) - 2 = 0.7182818
    k3 = [math.exp(-0.5) - 0.5, math.e - 2]
    assert kl_estimate(logp, base, "k3")[0].tolist() == pytest.approx(k3)
    assert kl_estimate(logp, base, "low_var_kl")[0].tolist() == pytest.approx(k3)


def test_low_var_kl_clamps():
    # d = -30: -d clamped to 20 -> exp(20) - 1 - 20 is huge -> clamped to 10; d = +30: exp(-20) - 1 + 20 -> 10
    # d = 5: exp(-5) - 1 + 5 = 4.0067379 (inside the clamp)
    d = torch.tensor([[-30.0, 30.0, 5.0]])
    out = kl_estimate(d, torch.zeros_like(d), "low_var_kl")
    assert out[0].tolist() == pytest.approx([10.0, 10.0, math.exp(-5) + 4])
    assert torch.isinf(kl_estimate(torch.tensor([-100.0]), torch.zeros(1), "k3")).all()


@pytest.mark.parametrize("kl_type", sorted(KL_ESTIMATORS))
def test_kl_loop_vs_vectorised(kl_type, batch):
    out = kl_estimate(batch.logp, batch.ref, kl_type)
    for i in range(out.shape[0]):
        for t in range(out.shape[1]):
            d = batch.logp[i, t].item() - batch.ref[i, t].item()
            ref = {
                "k1": d,
                "k2": d * d / 2,
                "k3": math.exp(-d) - 1 + d,
                "low_var_kl": min(max(math.exp(min(max(-d, -20), 20)) - 1 - min(max(-d, -20), 20), -10), 10),
            }[kl_type]
            assert out[i, t].item() == pytest.approx(ref, rel=1e-5, abs=1e-6)


def test_kl_unknown_type():
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
