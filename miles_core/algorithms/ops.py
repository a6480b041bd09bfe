"""Masked tensor helpers shared by the estimators and losses.

Shapes: N samples, T response tokens (right-padded), V vocab. A mask is float 0/1 with the shape of
the tensor it masks; 0 marks padding and tokens that are not trained on.
"""

from __future__ import annotations

import torch
from torch import Tensor

WHITEN_EPS = 1e-8


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(x * mask) over `dim` (all dims when None)."""
    if dim is None:
        return (x * mask).sum()
    return (x * mask).sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(x * mask) / max(sum(mask), 1) over `dim` (all dims when None); 0 where nothing is masked in."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_whiten(x: Tensor, mask: Tensor) -> Tensor:
    """(x - mean) / sqrt(var + 1e-8) with the masked mean and the masked population variance over all
    elements; 0 where mask == 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + WHITEN_EPS) * mask


def sequence_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Per-sample masked token mean. x, mask [N, T] -> [N]."""
    return masked_mean(x, mask, dim=-1)


def broadcast_tokens(per_sample: Tensor, like: Tensor) -> Tensor:
    """[N] -> [N, T] (a view) with the shape of `like`."""
    return per_sample.unsqueeze(-1).expand_as(like)  # [N, T]


def last_token_mask(mask: Tensor) -> Tensor:
    """1 at the last position where mask == 1 in each row, 0 elsewhere (all 0 for an empty row). [N, T]."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)  # [N, T]
    last = torch.where(mask > 0, positions, -1).max(dim=-1, keepdim=True).values  # [N, 1]
    return ((positions == last) & (last >= 0)).to(mask.dtype)


def discounted_cumsum(x: Tensor, gamma: float) -> Tensor:
    """y_t = sum_{s >= t} gamma^(s - t) x_s along the last dim. [N, T] -> [N, T]."""
    out = torch.empty_like(x)
    running = torch.zeros_like(x[..., 0])
    for t in range(x.shape[-1] - 1, -1, -1):
        running = x[..., t] + gamma * running
        out[..., t] = running
    return out


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the vocab, in float32. [N, T, V] -> [N, T].

    Logits must already be divided by the rollout temperature (REFERENCE §2)."""
    return entropy_from_log_probs(torch.log_softmax(logits.float(), dim=-1))


def entropy_from_log_probs(log_p: Tensor) -> Tensor:
    """Entropy from log_softmax(logits / T) already made (the trainer's own pass): [N, T, V] -> [N, T]."""
    return -(log_p.exp() * log_p).sum(dim=-1)
