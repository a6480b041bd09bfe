"""REINFORCE++ (Hu 2025): discounted return of KL-shaped token rewards.

    reward_t = -kl_coef * kl_t * m_t + r * [t == last trainable token]
    A_t      = sum_{s >= t} gamma^(s - t) reward_s            then A_t *= m_t

kl_t = kl_estimate(logp_old, logp_ref, kl_loss_type) (the reference system reuses the loss KL type for
the reward-level KL). Discounting runs over positions, so non-trainable tokens in the middle of a
response (tool output) carry reward 0 but still count in the exponent. No group baseline: combine with
`normalize_advantages` as the paper does. Metrics: reward_kl (token mean of kl_t, when kl_coef > 0).
"""

from __future__ import annotations

from miles_core.config.algo import AlgoConfig

from ..ops import discounted_cumsum
from .base import AdvantageInputs, EstimatorResult, token_rewards


def reinforce_plus_plus_advantages(algo: AlgoConfig, inputs: AdvantageInputs) -> EstimatorResult:
    rewards, metrics = token_rewards(algo, inputs)  # [N, T]
    return discounted_cumsum(rewards, algo.gamma) * inputs.loss_mask, None, metrics
