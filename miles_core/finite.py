"""The NaN/inf guard of the trainers: the reference's ``check_for_nan_in_loss_and_grad`` (on by default in
megatron's arguments; megatron-core's ``param_and_grad_buffer.py`` ``check_grads`` rejects a NaN or an Inf
grad norm with ``fatal=True``) as one check before every optimizer step, so an optimizer never steps on
non-finite gradients; and the weights' check before a checkpoint save or an export, so no non-finite tensor
is ever written as a model.

A failure is :class:`NonFiniteTraining`, naming the rollout, the optimizer step and what was not finite.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

import torch


class NonFiniteTraining(FloatingPointError):
    """A loss, a grad norm or a weight is NaN or inf: the step or the save did not happen."""


def _word(value: float) -> str:
    return "NaN" if math.isnan(value) else "Inf"


def check_loss_and_grad(loss: float | torch.Tensor | None, grad_norm: float | torch.Tensor, *,
                        step: int | None = None, model: str = "actor") -> None:
    """Raise NonFiniteTraining when ``loss`` (None: this rank has none, e.g. a pipeline stage before the last) or
    ``grad_norm`` is not finite; called after the backward and the norm, before ``optimizer.step()``."""
    for what, value in (("loss", loss), ("grad norm", grad_norm)):
        if value is not None and not math.isfinite(float(value)):
            raise NonFiniteTraining(
                f"{'' if step is None else f'optimizer step {step}: '}found {_word(float(value))} in the {model} {what}; the optimizer step was "
                "not taken and nothing was saved (a NaN reward, an lr too high, or log-probs of tokens past the "
                "model's context are the usual causes); the last checkpoint is intact")


@contextlib.contextmanager
def in_rollout(rollout_id: int) -> Iterator[None]:
    """Name the rollout in a NonFiniteTraining raised inside (the trainer's steps of one rollout)."""
    try:
        yield
    except NonFiniteTraining as exc:
        raise NonFiniteTraining(f"rollout {rollout_id}, {exc}") from None


def check_weights(named: Iterable[tuple[str, torch.Tensor]], what: str) -> None:
    """Raise NonFiniteTraining naming the first tensor of ``named`` holding NaN or inf, before ``what`` (a
    checkpoint save, an export) writes them."""
    for name, tensor in named:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise NonFiniteTraining(f"{what}: tensor {name!r} holds NaN or Inf; refusing to write non-finite weights")
