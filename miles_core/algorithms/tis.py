"""Vanilla truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly
brings you off-policy RL training") and the signature every TIS function shares.

    d_t = logp_old_t - logp_roll_t,   w_t = exp(clamp(d_t, -20, 20))
    pg_t *= clamp(w_t, tis_clip_low, tis_clip)                     (defaults 0 and 2.0)
    tis = R(w), tis_clipfrac = R([w < tis_clip_low or w > tis_clip]), tis_abs = R(|w - 1|)

Signature of a TIS function (built-in or `custom_tis_function_path`):

    fn(inputs: TISInputs) -> (weights [N, T], loss_mask [N, T], metrics: dict[str, Tensor])

weights multiply the per-token policy-gradient loss; the returned mask replaces the loss mask for every
term reduced after the correction; metrics are scalars reduced with inputs.reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from miles_core.config.algo import AlgoConfig

from .reducer import Reducer

LOG_WEIGHT_BOUND = 20.0


@dataclass(frozen=True)
class TISInputs:
    """What a TIS function sees. Per-token tensors [N, T]."""

    algo: AlgoConfig
    old_log_probs: Tensor  # [N, T] trainer-side log-probs of the old policy (the "training" side)
    rollout_log_probs: Tensor  # [N, T] engine log-probs
    loss_mask: Tensor  # [N, T]
    reduce: Reducer
    options: Mapping[str, Any] = field(default_factory=dict)  # YAML of custom_config_path


TISFunction = Callable[[TISInputs], tuple[Tensor, Tensor, dict[str, Tensor]]]


def log_weights(old_log_probs: Tensor, rollout_log_probs: Tensor) -> Tensor:
    """d = logp_old - logp_roll. [N, T]."""
    return (old_log_probs - rollout_log_probs).detach()


def vanilla_tis(inputs: TISInputs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """w = exp(d) clamped to [tis_clip_low, tis_clip]; mask unchanged."""
    algo, mask, reduce = inputs.algo, inputs.loss_mask, inputs.reduce
    d = log_weights(inputs.old_log_probs, inputs.rollout_log_probs)  # [N, T]
    w = torch.exp(torch.clamp(d, -LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND))
    clipped = ((w < algo.tis_clip_low) | (w > algo.tis_clip)).to(mask.dtype)
    metrics = {"tis": reduce(w, mask), "tis_clipfrac": reduce(clipped, mask), "tis_abs": reduce((w - 1).abs(), mask)}
    return torch.clamp(w, algo.tis_clip_low, algo.tis_clip), mask, metrics
