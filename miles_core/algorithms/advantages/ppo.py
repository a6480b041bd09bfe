"""PPO advantages with GAE (Schulman et al. 2016) over KL-shaped token rewards, on trainable tokens only.

    reward_t = -kl_coef * kl_t * m_t + r * [t == last trainable token]
    t'       = the next trainable token after t (m_t' = 1)
    delta_t  = reward_t + gamma * V_t' - V_t          (V after the last trainable token = 0)
    A_t      = delta_t + gamma * lambd * A_t'         (A after the last trainable token = 0)
    R_t      = A_t + V_t                              (critic targets)
    A, R     = 0 where m_t = 0

The recursion runs over the subsequence of trainable tokens (REFERENCE §3, as the reference system): an
untrained span inside a response (multi-turn tool output) is skipped, not stepped through, so it adds no
value delta and no extra gamma * lambd decay. Padding is the same as a span at the end. A sample with no
trainable token gets zeros. Metrics: values, returns (token means), reward_kl (when kl_coef > 0).
"""

from __future__ import annotations

import torch

from miles_core.config.algo import AlgoConfig

from .base import AdvantageInputs, EstimatorResult, token_rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lambd: float) -> torch.Tensor:
    """GAE along the last dim over the tokens with mask == 1 only. rewards, values, mask [N, T] -> [N, T]
    (0 where mask == 0)."""
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])  # [N] A_t' of the next trainable token
    next_value = torch.zeros_like(running)  # [N] V_t' of the next trainable token
    for t in range(rewards.shape[-1] - 1, -1, -1):
        trainable = mask[..., t] > 0  # [N]
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        step = delta + gamma * lambd * running
        running = torch.where(trainable, step, running)
        next_value = torch.where(trainable, values[..., t], next_value)
        advantages[..., t] = torch.where(trainable, step, torch.zeros_like(step))
    return advantages


def ppo_advantages(algo: AlgoConfig, inputs: AdvantageInputs) -> EstimatorResult:
    if inputs.values is None:
        raise ValueError("advantage_estimator='ppo' needs critic values (AdvantageInputs.values)")
    mask = inputs.loss_mask
    rewards, metrics = token_rewards(algo, inputs)  # [N, T]
    values = inputs.values.to(mask.dtype) * mask  # [N, T]
    advantages = gae(rewards, values, mask, algo.gamma, algo.lambd)
    returns = (advantages + values) * mask
    count = mask.sum().clamp(min=1.0)
    metrics |= {"values": float(values.sum() / count), "returns": float(returns.sum() / count)}
    return advantages, returns, metrics
