"""Shared random batches for the algorithm tests: uneven lengths, right padding, holes in the mask."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch


@dataclass
class Batch:
    mask: torch.Tensor  # [N, T]
    old: torch.Tensor  # [N, T]
    logp: torch.Tensor  # [N, T]
    rollout: torch.Tensor  # [N, T]
    ref: torch.Tensor  # [N, T]
    teacher: torch.Tensor  # [N, T]
    values: torch.Tensor  # [N, T]
    entropy: torch.Tensor  # [N, T]
    advantages: torch.Tensor  # [N, T]
    rewards: torch.Tensor  # [N]
    group_index: torch.Tensor  # [N] shuffled group ids


def make_batch(n: int = 8, t: int = 7, seed: int = 0, spread: float = 0.3, group_size: int = 4) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    lengths[0] = t  # at least one full row
    positions = torch.arange(t).expand(n, t)
    mask = (positions < lengths[:, None]).float()
    holes = (torch.rand(n, t, generator=g) < 0.15) & (positions > 0)
    mask = mask * (~holes).float()  # non-trainable tokens inside responses
    if n > 2:
        mask[n - 1] = 0.0  # one sample with nothing to train on
    def lp(scale: float = 1.0) -> torch.Tensor:
        return -torch.rand(n, t, generator=g) * 2 * scale
    old = lp()
    def near(x: torch.Tensor) -> torch.Tensor:
        return x + spread * torch.randn(n, t, generator=g)
    padding = (positions >= lengths[:, None]).float()
    keep = 1 - padding  # padding carries zeros, as the trainer pads
    return Batch(
        mask=mask,
        old=old * keep,
        logp=near(old) * keep,
        rollout=near(old) * keep,
        ref=near(old) * keep,
        teacher=near(old) * keep,
        values=torch.randn(n, t, generator=g) * keep,
        entropy=torch.rand(n, t, generator=g) * keep,
        advantages=torch.randn(n, t, generator=g) * mask,
        rewards=torch.randint(0, 3, (n,), generator=g).float(),
        group_index=torch.arange(n)[torch.randperm(n, generator=g)] // group_size,
    )


@pytest.fixture
def batch() -> Batch:
    return make_batch()


@pytest.fixture
def make():
    return make_batch
