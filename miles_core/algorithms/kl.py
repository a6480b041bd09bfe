"""KL estimators between two policies from the log-probs of the sampled tokens (REFERENCE §3).

With d = logp - logp_base (samples drawn from the first policy):
    k1 = d
    k2 = d^2 / 2
    k3 = exp(-d) - 1 + d                     (Schulman's unbiased, non-negative estimator)
    low_var_kl = k3 with -d clamped to [-20, 20] and the result clamped to [-10, 10]

use_unbiased_kl (the reference's, after DeepSeek-V3.2): each estimate times the importance ratio
pi_theta / pi_old = exp(logp - logp_old) of its token, which stays in the graph (for low_var_kl the product is
clamped, not the estimate).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _k1(d: Tensor) -> Tensor:
    return d


def _k2(d: Tensor) -> Tensor:
    return d.square() / 2


def _k3(d: Tensor) -> Tensor:
    return torch.exp(-d) - 1 + d


def _low_var_kl(d: Tensor) -> Tensor:
    neg = torch.clamp(-d, -20.0, 20.0)
    return torch.clamp(torch.exp(neg) - 1 - neg, -10.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
    "low_var_kl": _low_var_kl,
}


def kl_estimate(log_probs: Tensor, base_log_probs: Tensor, kl_type: str, importance_ratio: Tensor | None = None) -> Tensor:
    """Per-token KL(pi || pi_base) estimate. log_probs, base_log_probs [N, T] -> [N, T] (float32); with
    ``importance_ratio`` [N, T] (use_unbiased_kl) each estimate is weighted by it."""
    if kl_type not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_type {kl_type!r}; expected one of {sorted(KL_ESTIMATORS)}")
    d = log_probs.float() - base_log_probs.float()
    if importance_ratio is None:
        return KL_ESTIMATORS[kl_type](d)
    if kl_type == "low_var_kl":
        neg = torch.clamp(-d, -20.0, 20.0)
        return torch.clamp(importance_ratio.float() * (torch.exp(neg) - 1 - neg), -10.0, 10.0)
    return importance_ratio.float() * KL_ESTIMATORS[kl_type](d)
