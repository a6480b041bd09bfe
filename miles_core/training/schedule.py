"""The learning-rate schedule of every backend (rl_step.py applies it for the actor and the critic): linear
warm-up over lr_warmup_iters optimizer steps for the actor, critic_lr_warmup_iters for the critic (the reference's
split), then constant lr. And reset_optimizer_states' reset of an optimizer's Adam state, for either trainer's
optimizer (torch's AdamW, or megatron-core's wrappers around it)."""

from __future__ import annotations


def warmup_factor(warmup_iters: int, steps_done: int) -> float:
    """The warm-up factor of optimizer step steps_done + 1 (1 without warm-up)."""
    return min(1.0, (steps_done + 1) / warmup_iters) if warmup_iters else 1.0


def learning_rate(base: float, warmup_iters: int, steps_done: int) -> float:
    """The learning rate of optimizer step steps_done + 1 for a model whose constant rate is ``base`` (lr for the
    actor, critic_lr or lr for the critic) and whose warm-up is ``warmup_iters`` steps."""
    return base * warmup_factor(warmup_iters, steps_done)


def adam_optimizers(optimizer) -> list:
    """The torch optimizers inside ``optimizer``: itself, megatron-core's wrapped one (``.optimizer``), or each of a
    ChainedOptimizer's (``.chained_optimizers``)."""
    if hasattr(optimizer, "chained_optimizers"):
        return [c.optimizer for c in optimizer.chained_optimizers]
    return [getattr(optimizer, "optimizer", optimizer)]


def reset_adam_state(optimizer) -> None:
    """Zero the Adam state of ``optimizer``: each parameter's step count and first and second moments (the
    reference's --reset-optimizer-states: ``group["step"] = 0``, ``exp_avg`` and ``exp_avg_sq`` zeroed). The
    learning-rate schedule, which counts its own steps, is untouched. megatron-core's optimizers hold torch's inside
    (``.optimizer``; a ChainedOptimizer several, ``.chained_optimizers``)."""
    for opt in adam_optimizers(optimizer):
        for group in opt.param_groups:
            if "step" in group:
                group["step"] = 0
        for state in opt.state.values():
            for key in ("step", "exp_avg", "exp_avg_sq"):
                value = state.get(key)
                if hasattr(value, "zero_"):
                    value.zero_()
                elif value is not None:
                    state[key] = 0
