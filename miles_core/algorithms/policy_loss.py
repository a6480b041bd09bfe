"""PPO clipped surrogate (Schulman et al. 2017) with dual clip (Ye et al. 2020) and GSPO's sequence ratio.

    log_ratio_t = logp_t - logp_old_t                    GSPO: masked mean of log_ratio over the sequence
    log_ratio_t = clamp(log_ratio_t, -20, 20);  ratio_t = exp(log_ratio_t)
    L_t = max(-ratio_t A_t, -clip(ratio_t, 1 - eps_clip, 1 + eps_clip_high) A_t)     eps_clip_high := eps_clip if unset
    dual clip (eps_clip_c > 1):  L_t = min(L_t, -eps_clip_c A_t)  where A_t < 0

Per-token side quantities (reduced by the caller with R):
    pg_clipfrac_t = [clipped branch > unclipped branch]
    ppo_kl_t      = logp_old_t - logp_t  (the sequence-mean version for GSPO), detached

GSPO (Zheng et al. 2025) defines s_i = exp(mean_t log_ratio_it); using the masked mean as every token's log
ratio and reducing per sample gives the same gradient as the paper's sg[s_i] * pi/sg[pi] form. The clamp
to [-20, 20] (an overflow guard) is applied after the GSPO mean.
"""

from __future__ import annotations

import torch
from torch import Tensor

from miles_core.config.algo import AlgoConfig

from .ops import broadcast_tokens, sequence_mean

LOG_RATIO_BOUND = 20.0


def policy_log_ratio(algo: AlgoConfig, log_probs: Tensor, old_log_probs: Tensor, loss_mask: Tensor) -> Tensor:
    """logp - logp_old, or its masked sequence mean broadcast over tokens for gspo. [N, T]."""
    log_ratio = log_probs - old_log_probs  # [N, T]
    if algo.advantage_estimator == "gspo":
        log_ratio = broadcast_tokens(sequence_mean(log_ratio, loss_mask), log_ratio)  # [N, T]
    return log_ratio


def ppo_clip(
    algo: AlgoConfig, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """-> (per-token loss L [N, T], {"pg_clipfrac": [N, T], "ppo_kl": [N, T]}), nothing reduced yet."""
    log_ratio = policy_log_ratio(algo, log_probs, old_log_probs, loss_mask)
    ratio = torch.exp(torch.clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    eps_high = algo.eps_clip if algo.eps_clip_high is None else algo.eps_clip_high
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1 - algo.eps_clip, 1 + eps_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).to(advantages.dtype)
    if algo.eps_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -algo.eps_clip_c * advantages), loss)
    return loss, {"pg_clipfrac": clipfrac.detach(), "ppo_kl": (-log_ratio).detach()}
