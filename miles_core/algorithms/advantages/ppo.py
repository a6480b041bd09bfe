"""PPO advantages with GAE (Schulman et al. 2016) over KL-shaped token rewards.

    reward_t = -kl_coef * kl_t * m_t + r * [t == last trainable token]
    V_t      = values_t * m_t                         (V = 0 on padding and non-trainable tokens)
    delta_t  = reward_t + gamma * V_{t+1} - V_t       (V_T = 0)
    A_t      = delta_t + gamma * lambd * A_{t+1}      (A_T = 0)
    R_t      = A_t + V_t                              (critic targets)
    A, R     *= m

Departure (as the reference system and OpenRLHF): non-trainable tokens inside a response are not
skipped; their value is taken as 0. With lambd = 1 this is exact; with lambd < 1 it shortens the GAE
trace across such spans. Metrics: values, returns (token means), reward_kl (when kl_coef > 0).
"""

from __future__ import annotations

import torch

from miles_core.config.algo import AlgoConfig

from .base import AdvantageInputs, EstimatorResult, token_rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float) -> torch.Tensor:
    """Generalized advantage estimate along the last dim. rewards, values [N, T] -> [N, T]."""
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[..., 0])  # [N]
    next_value = torch.zeros_like(running)
    for t in range(rewards.shape[-1] - 1, -1, -1):
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        running = delta + gamma * lambd * running
        advantages[..., t] = running
        next_value = values[..., t]
    return advantages


def ppo_advantages(algo: AlgoConfig, inputs: AdvantageInputs) -> EstimatorResult:
    if inputs.values is None:
        raise ValueError("advantage_estimator='ppo' needs critic values (AdvantageInputs.values)")
    mask = inputs.loss_mask
    rewards, metrics = token_rewards(algo, inputs)  # [N, T]
    values = inputs.values.to(mask.dtype) * mask  # [N, T]
    advantages = gae(rewards, values, algo.gamma, algo.lambd) * mask
    returns = (advantages + values) * mask
    count = mask.sum().clamp(min=1.0)
    metrics |= {"values": float(values.sum() / count), "returns": float(returns.sum() / count)}
    return advantages, returns, metrics
