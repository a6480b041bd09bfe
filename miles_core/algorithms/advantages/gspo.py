"""GSPO advantages (Zheng et al. 2025): identical to GRPO's group-normalized reward.

    A_it = r'_i * m_it      with r' as in grpo (same flags)

GSPO differs from GRPO only in the policy loss, where the per-token log ratio is replaced by its masked
sequence mean (see policy_loss.py). Keeping a separate table entry makes that switch explicit.
"""

from __future__ import annotations

from miles_core.config.algo import AlgoConfig

from .base import AdvantageInputs, EstimatorResult
from .grpo import grpo_advantages


def gspo_advantages(algo: AlgoConfig, inputs: AdvantageInputs) -> EstimatorResult:
    return grpo_advantages(algo, inputs)
