"""Clipped critic loss (PPO; as in OpenAI baselines / the reference system).

    V_clip_t = V_old_t + clip(V_t - V_old_t, -value_clip, value_clip)
    L_t      = max((V_clip_t - R_t)^2, (V_t - R_t)^2)          no 1/2 factor (REFERENCE §3)
    critic-value_loss = R(L),  critic-value_clipfrac = R([|V_t - V_old_t| > value_clip])   (the reference's names)
"""

from __future__ import annotations

import torch
from torch import Tensor

from miles_core.config.algo import AlgoConfig

from .reducer import Reducer


def value_loss(
    algo: AlgoConfig, values: Tensor, old_values: Tensor, returns: Tensor, loss_mask: Tensor, reduce: Reducer
) -> tuple[Tensor, dict[str, Tensor]]:
    """values (requires grad), old_values, returns, loss_mask [N, T] -> (scalar loss, {critic-value_loss, critic-value_clipfrac})."""
    delta = values - old_values
    clipped = old_values + torch.clamp(delta, -algo.value_clip, algo.value_clip)
    per_token = torch.maximum((clipped - returns).square(), (values - returns).square())
    loss = reduce(per_token, loss_mask)
    clipfrac = reduce((delta.detach().abs() > algo.value_clip).to(loss_mask.dtype), loss_mask)
    return loss, {"critic-value_loss": loss.detach(), "critic-value_clipfrac": clipfrac}
