"""The learning-rate schedule of every backend (rl_step.py applies it for the actor and the critic): linear
warm-up over lr_warmup_iters optimizer steps, then constant lr."""

from __future__ import annotations

from miles_core.config.algo import AlgoConfig


def warmup_factor(algo: AlgoConfig, steps_done: int) -> float:
    """The warm-up factor of optimizer step steps_done + 1 (1 without lr_warmup_iters)."""
    w = algo.lr_warmup_iters
    return min(1.0, (steps_done + 1) / w) if w else 1.0


def learning_rate(base: float, algo: AlgoConfig, steps_done: int) -> float:
    """The learning rate of optimizer step steps_done + 1 for a model whose constant rate is ``base``
    (lr for the actor, critic_lr or lr for the critic)."""
    return base * warmup_factor(algo, steps_done)
