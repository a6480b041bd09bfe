"""Off-Policy Sequence Masking (use_opsm; DeepSeek-V3.2), as the reference's compute_opsm_mask
(miles/backends/training_utils/loss_hub/math_utils.py).

Per sample i, with the current policy logp and the old policy logp_old (the engine's with use_rollout_logprobs):

    seq_kl_i = sum_t (logp_old_it - logp_it) m_it / max(sum_t m_it, 1)                  (no gradient: a comparison)
    drop_it  = [A_it < 0 and seq_kl_i > opsm_delta]
    pg_it   <- pg_it * (1 - drop_it)                  (before any rollout correction; the denominators of R unchanged)
    opsm_clipfrac = sum_i (sum_t drop_it m_it / max(sum_t m_it, 1)) / D,   D = num_samples (num_tokens per-token loss)

A negative-advantage sequence the policy has already moved away from by more than opsm_delta (in mean
log-prob) stops pushing it further. Departure: the reference counts dropped tokens over the whole response,
here only tokens in the loss mask (the others carry no loss either way).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .ops import masked_sum, sequence_mean
from .reducer import Reducer


def opsm_keep(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, loss_mask: Tensor, delta: float,
              reduce: Reducer) -> tuple[Tensor, Tensor]:
    """-> (keep [N, T]: 1 - drop, opsm_clipfrac scalar). Inputs [N, T]."""
    seq_kl = sequence_mean(old_log_probs - log_probs.detach(), loss_mask)  # [N]
    drop = ((advantages < 0) & (seq_kl > delta).unsqueeze(-1)).to(loss_mask.dtype)  # [N, T]
    per_sample = masked_sum(drop, loss_mask, dim=-1) / loss_mask.sum(dim=-1).clamp(min=1.0)  # [N]
    return 1.0 - drop, reduce.normalize(per_sample.sum())
