"""Advantage estimators: one module per estimator, one name table keyed by `advantage_estimator`.

compute_advantages = estimator -> OPD (use_opd) -> batch whitening (normalize_advantages).
The batch given here must be the whole rollout: the whitening statistics are taken over it.
"""

from __future__ import annotations

from miles_core.config.algo import AlgoConfig

from ..opd import apply_opd, sampled_token_kl
from ..ops import masked_mean, masked_whiten
from .base import AdvantageInputs, Estimator, EstimatorResult, group_normalize, normalized_rewards
from .grpo import grpo_advantages
from .gspo import gspo_advantages
from .ppo import gae, ppo_advantages
from .reinforce_plus_plus import reinforce_plus_plus_advantages
from .reinforce_plus_plus_baseline import reinforce_plus_plus_baseline_advantages

ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo_advantages,
    "gspo": gspo_advantages,
    "reinforce_plus_plus": reinforce_plus_plus_advantages,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantages,
    "ppo": ppo_advantages,
}


def compute_advantages(algo: AlgoConfig, inputs: AdvantageInputs) -> EstimatorResult:
    """-> (advantages [N, T], 0 where loss_mask == 0; returns [N, T] (ppo) or None; metrics (floats, no prefix)).

    Metrics: advantages (token mean of the final advantages) plus the estimator's own
    (zero_std_groups, reward_kl, values, returns) and opd_reverse_kl with use_opd.
    """
    estimator = ADVANTAGE_ESTIMATORS.get(algo.advantage_estimator)
    if estimator is None:
        raise ValueError(
            f"unknown advantage_estimator {algo.advantage_estimator!r}; expected one of {sorted(ADVANTAGE_ESTIMATORS)}"
        )
    advantages, returns, metrics = estimator(algo, inputs)
    mask = inputs.loss_mask
    if algo.use_opd:
        if inputs.opd_reverse_kl is not None:  # top-k OPD (opd_log_prob_top_k): the estimate, precomputed
            reverse_kl = inputs.opd_reverse_kl
        elif inputs.teacher_log_probs is not None:
            reverse_kl = sampled_token_kl(inputs.old_log_probs, inputs.teacher_log_probs)
        else:
            raise ValueError("use_opd is set but AdvantageInputs has neither teacher_log_probs nor opd_reverse_kl; "
                             "score the teacher first")
        advantages, opd_metrics = apply_opd(advantages, reverse_kl, mask, algo.opd_kl_coef)
        metrics |= opd_metrics
    if algo.normalize_advantages:
        advantages = masked_whiten(advantages, mask)
    metrics["advantages"] = float(masked_mean(advantages, mask))
    return advantages, returns, metrics


__all__ = [
    "ADVANTAGE_ESTIMATORS", "AdvantageInputs", "Estimator", "EstimatorResult", "compute_advantages", "gae",
    "group_normalize", "normalized_rewards", "grpo_advantages", "gspo_advantages", "ppo_advantages",
    "reinforce_plus_plus_advantages", "reinforce_plus_plus_baseline_advantages",
]
