"""GRPO advantages (Shao et al. 2024, DeepSeekMath) with the Dr.GRPO switch.

    r'_i = (r_i - mean_g r) / (std_g r + 1e-6)       g = the group of sample i (same group_index)
    A_it = r'_i * m_it                                every response token gets the sample's value

std_g is the unbiased std; the division happens only when std_g > 0 and the group has more than one
sample (a constant group stays 0 after centering instead of being divided by 1e-6).
`disable_grpo_std_normalization` keeps the centering only (Dr.GRPO, Liu et al. 2025);
`disable_rewards_normalization` uses the raw reward r_i.
Metrics: zero_std_groups (groups not divided by their std).
"""

from __future__ import annotations

from miles_core.config.algo import AlgoConfig

from .base import AdvantageInputs, EstimatorResult, group_normalize


def grpo_advantages(algo: AlgoConfig, inputs: AdvantageInputs) -> EstimatorResult:
    shaped, metrics = group_normalize(
        inputs.rewards,
        inputs.group_index,
        center=not algo.disable_rewards_normalization,
        scale=not algo.disable_grpo_std_normalization,
    )  # [N]
    mask = inputs.loss_mask
    return shaped.to(mask.dtype).unsqueeze(-1) * mask, None, metrics  # [N, T]
