"""Inputs and shared pieces of the advantage estimators.

Every estimator has the signature

    estimator(algo: AlgoConfig, inputs: AdvantageInputs) -> (advantages [N, T], returns [N, T] | None, metrics)

advantages are 0 where loss_mask == 0; returns is None except for ppo; metrics are plain floats named
without a prefix (the caller logs them under `rollout/`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from miles_core.config.algo import AlgoConfig

from ..kl import kl_estimate
from ..ops import last_token_mask

GROUP_STD_EPS = 1e-6


@dataclass
class AdvantageInputs:
    """Everything an estimator may read. Per-token tensors are [N, T] float32, right-padded."""

    rewards: Tensor  # [N] scalar reward per sample
    group_index: Tensor  # [N] long; samples with the same value form a group (positions are irrelevant)
    loss_mask: Tensor  # [N, T]
    old_log_probs: Tensor  # [N, T] old policy (trainer recompute, or rollout with use_rollout_logprobs)
    ref_log_probs: Tensor | None = None  # [N, T] needed only when kl_coef > 0
    values: Tensor | None = None  # [N, T] critic values (ppo)
    teacher_log_probs: Tensor | None = None  # [N, T] (use_opd, sampled-token)
    opd_reverse_kl: Tensor | None = None  # [N, T] (use_opd with opd_log_prob_top_k: the top-k estimate, opd.py)


EstimatorResult = tuple[Tensor, Tensor | None, dict[str, float]]
Estimator = Callable[[AlgoConfig, AdvantageInputs], EstimatorResult]


def group_normalize(
    rewards: Tensor, group_index: Tensor, *, center: bool, scale: bool
) -> tuple[Tensor, dict[str, float]]:
    """r' = (r - mean_g) / (std_g + 1e-6) per group g (REFERENCE §3, grpo).

    std_g is the unbiased std; the division happens only for groups with std_g > 0 and more than one
    sample. center=False returns r unchanged (scale is then ignored). Stats are computed in float64.
    rewards [N], group_index [N] -> r' [N] float32, metrics.
    """
    if not center:
        return rewards.float(), {}
    r = rewards.double()
    _, inv = torch.unique(group_index, return_inverse=True)  # inv [N]: dense group id
    num_groups = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.bincount(inv, minlength=num_groups).double()  # [G]
    mean = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, inv, r) / count  # [G]
    centered = r - mean[inv]  # [N]
    sq = torch.zeros_like(mean).index_add_(0, inv, centered.square())  # [G]
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0))  # [G] unbiased
    divisible = (std > 0) & (count > 1)  # [G]
    zero_std_groups = float((~divisible).sum())
    if scale:
        denom = torch.where(divisible, std + GROUP_STD_EPS, torch.ones_like(std))  # [G]
        centered = centered / denom[inv]
    return centered.float(), {"zero_std_groups": zero_std_groups}


# estimators that normalise the scalar rewards per group first -> whether they divide by the group std
GROUP_NORMALIZED: dict[str, bool] = {"grpo": True, "gspo": True, "reinforce_plus_plus_baseline": False}


def normalized_rewards(algo: AlgoConfig, rewards: Tensor, group_index: Tensor) -> Tensor:
    """The scalar rewards after the estimator's group normalisation (what the reference logs as rollout/rewards):
    grpo/gspo r' (scaled unless disable_grpo_std_normalization), reinforce++ baseline r - mean_g, others r.
    rewards, group_index [N] -> [N]."""
    scale = GROUP_NORMALIZED.get(algo.advantage_estimator)
    if scale is None:
        return rewards.float()
    center, scale = not algo.disable_rewards_normalization, scale and not algo.disable_grpo_std_normalization
    return group_normalize(rewards, group_index, center=center, scale=scale)[0]


def token_kl(algo: AlgoConfig, inputs: AdvantageInputs) -> Tensor:
    """Reward-level KL kl_t = kl_estimate(logp_old, logp_ref, kl_loss_type) * m_t, zeros when kl_coef == 0. [N, T]."""
    if algo.kl_coef == 0:
        return torch.zeros_like(inputs.loss_mask)
    if inputs.ref_log_probs is None:
        raise ValueError(
            f"kl_coef={algo.kl_coef} with advantage_estimator={algo.advantage_estimator!r} needs ref_log_probs; "
            "compute reference log-probs or set kl_coef: 0"
        )
    return kl_estimate(inputs.old_log_probs, inputs.ref_log_probs, algo.kl_loss_type) * inputs.loss_mask


def token_rewards(algo: AlgoConfig, inputs: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """-kl_coef * kl_t on every trainable token plus the scalar reward on the last trainable token. [N, T]."""
    mask = inputs.loss_mask
    kl = token_kl(algo, inputs)  # [N, T]
    terminal = last_token_mask(mask) * inputs.rewards.to(mask.dtype).unsqueeze(-1)  # [N, T]
    metrics = {"reward_kl": float(kl.sum() / mask.sum().clamp(min=1.0))} if algo.kl_coef > 0 else {}
    return terminal - algo.kl_coef * kl, metrics
