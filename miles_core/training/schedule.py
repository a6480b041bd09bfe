"""The learning-rate schedule of every backend (rl_step.py applies it for the actor and the critic): linear
warm-up over lr_warmup_iters optimizer steps for the actor, critic_lr_warmup_iters for the critic (the reference's
split), then constant lr."""

from __future__ import annotations


def warmup_factor(warmup_iters: int, steps_done: int) -> float:
    """The warm-up factor of optimizer step steps_done + 1 (1 without warm-up)."""
    return min(1.0, (steps_done + 1) / warmup_iters) if warmup_iters else 1.0


def learning_rate(base: float, warmup_iters: int, steps_done: int) -> float:
    """The learning rate of optimizer step steps_done + 1 for a model whose constant rate is ``base`` (lr for the
    actor, critic_lr or lr for the critic) and whose warm-up is ``warmup_iters`` steps."""
    return base * warmup_factor(warmup_iters, steps_done)
