"""Advantages over a multi-turn response: tool output is a hole in the loss mask inside the
response. GRPO gives every trainable token the sequence's advantage and the hole 0; GAE steps over
the trainable tokens only (REFERENCE §3: the hole is skipped, not stepped through; needs the GAE
fix of issue 20)."""

from __future__ import annotations

import torch

from miles_core.algorithms.advantages import compute_advantages
from miles_core.algorithms.advantages.base import AdvantageInputs
from miles_core.config.algo import AlgoConfig

MASK = [1, 1, 1, 0, 0, 0, 1, 1, 0]  # model turn, tool output, model turn, padding


def _inputs(values=None) -> AdvantageInputs:
    mask = torch.tensor([MASK, [1] * 5 + [0] * 4], dtype=torch.float)  # [N=2, T=9]
    return AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]), loss_mask=mask,
                           old_log_probs=torch.zeros_like(mask), values=values)


def test_grpo_advantage_is_the_sequences_on_model_tokens_and_zero_on_tool_output():
    adv, _, _ = compute_advantages(AlgoConfig(advantage_estimator="grpo"), _inputs())
    # group {1, 0}: mean 0.5, unbiased std 0.7071 -> r' = +-0.7071
    assert torch.allclose(adv[0], 0.70710 * torch.tensor(MASK, dtype=torch.float), atol=1e-4)


def test_gae_skips_the_tool_output():
    gamma, lambd = 0.9, 0.8
    values = torch.tensor([[0.1, 0.2, 0.3, 9.0, 9.0, 9.0, 0.4, 0.5, 0.0], [0.0] * 9])
    adv, returns, _ = compute_advantages(AlgoConfig(advantage_estimator="ppo", gamma=gamma, lambd=lambd), _inputs(values))
    # by hand over the trainable tokens t = 0, 1, 2, 6, 7 (reward 1 at t = 7, V after it = 0)
    order, v = [0, 1, 2, 6, 7], {0: 0.1, 1: 0.2, 2: 0.3, 6: 0.4, 7: 0.5}
    want, running = [0.0] * 9, 0.0
    for k in range(len(order) - 1, -1, -1):
        t = order[k]
        v_next = v[order[k + 1]] if k + 1 < len(order) else 0.0
        delta = (1.0 if t == 7 else 0.0) + gamma * v_next - v[t]
        running = delta + gamma * lambd * running
        want[t] = running
    assert torch.allclose(adv[0], torch.tensor(want), atol=1e-6), (adv[0], want)
    assert torch.allclose(returns[0], torch.tensor([a + v.get(t, 0.0) for t, a in enumerate(want)]) * torch.tensor(MASK), atol=1e-6)
