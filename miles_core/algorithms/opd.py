"""On-policy distillation (OPD): a reverse-KL penalty towards a teacher folded into the advantages.

    A_t <- A_t - opd_kl_coef * (logp_old_t - logp_teacher_t) * m_t

logp_old - logp_teacher is the k1 estimate of KL(pi_old || pi_teacher) on the sampled token, so the
policy is pushed towards tokens the teacher finds likelier. It applies after any estimator and before
`normalize_advantages`; ppo returns (critic targets) are left unchanged.
Logged as train/opd_reverse_kl = R(logp - logp_teacher) by the actor loss (current policy), and as
rollout/opd_reverse_kl (token mean with the old policy) by compute_advantages.
"""

from __future__ import annotations

from torch import Tensor

from .ops import masked_mean


def apply_opd(
    advantages: Tensor, old_log_probs: Tensor, teacher_log_probs: Tensor, loss_mask: Tensor, coef: float
) -> tuple[Tensor, dict[str, float]]:
    """advantages, old_log_probs, teacher_log_probs, loss_mask [N, T] -> (shifted advantages [N, T], metrics)."""
    reverse_kl = (old_log_probs - teacher_log_probs) * loss_mask  # [N, T]
    shifted = advantages - coef * reverse_kl
    return shifted, {"opd_reverse_kl": float(masked_mean(reverse_kl, loss_mask))}
