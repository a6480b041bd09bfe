"""REINFORCE++-baseline (Hu 2025): group-mean baseline, token KL penalty, no discounting.

    r'_i = r_i - mean_g r                   (skipped with disable_rewards_normalization)
    A_it = (r'_i - kl_coef * kl_it) * m_it

kl_t = kl_estimate(logp_old, logp_ref, kl_loss_type). No std division (the paper whitens over the batch
instead: set `normalize_advantages`). Metrics: zero_std_groups, reward_kl (when kl_coef > 0).
"""

from __future__ import annotations

from miles_core.config.algo import AlgoConfig

from .base import AdvantageInputs, EstimatorResult, group_normalize, token_kl


def reinforce_plus_plus_baseline_advantages(algo: AlgoConfig, inputs: AdvantageInputs) -> EstimatorResult:
    mask = inputs.loss_mask
    shaped, metrics = group_normalize(
        inputs.rewards, inputs.group_index, center=not algo.disable_rewards_normalization, scale=False
    )  # [N]
    kl = token_kl(algo, inputs)  # [N, T]
    if algo.kl_coef > 0:
        metrics["reward_kl"] = float(kl.sum() / mask.sum().clamp(min=1.0))
    return (shaped.to(mask.dtype).unsqueeze(-1) - algo.kl_coef * kl) * mask, None, metrics
