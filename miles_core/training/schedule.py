"""The learning-rate schedule both trainers apply: linear warm-up over lr_warmup_iters optimizer steps,
then constant lr."""

from __future__ import annotations

import torch

from miles_core.config.algo import AlgoConfig


def warmup_factor(algo: AlgoConfig, steps_done: int) -> float:
    """The warm-up factor of optimizer step steps_done + 1 (1 without lr_warmup_iters)."""
    w = algo.lr_warmup_iters
    return min(1.0, (steps_done + 1) / w) if w else 1.0


def set_lr(optimizer: torch.optim.Optimizer, algo: AlgoConfig, steps_done: int) -> float:
    """Set every param group's lr for the next step; -> that lr."""
    lr = algo.lr * warmup_factor(algo, steps_done)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
