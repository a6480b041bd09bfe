"""The PPO critic (`advantage_estimator: ppo`): a value model and its own optimizer.

Model: a copy of the policy's transformer body with a scalar value head, built as the HF
`AutoModelForTokenClassification` of the policy's config with `num_labels=1` (body + one Linear
per position; classifier dropout 0). The body starts from the policy's body weights, the head
from zero, so V = 0 before the first update (the first advantages are the plain returns).
It saves and loads like any HF model (`save_pretrained`, `AutoModelForTokenClassification`).

V_t of response token t is read at the position whose logits predict token t — the state before
the action, as in OpenRLHF and the reference system. Values are float32 [N, T].

One rollout: `values(batch)` in the forward-only phase gives V_old; after GAE, each optimizer step
also takes a critic step (rl_step.py, the same for every backend): the clipped value loss
(algorithms.value_loss) with the actor's reduction R, gradient accumulation over micro-batches (the torch
engine's backward), grad-norm clip `clip_grad`, AdamW with `critic_lr` (default `lr`) and the actor's warm-up. Metrics (the reference's names, under train/): critic-value_loss, critic-value_clipfrac,
critic-grad_norm, critic-lr-pg_0.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from miles_core.config.algo import AlgoConfig

from .batch import TokenBatch, at_response, forward, forward_only


def build_critic(policy: nn.Module) -> nn.Module:
    """A value model with the policy's body weights and a zero value head (same dtype and device)."""
    from transformers import AutoModelForTokenClassification

    config = policy.config.__class__.from_dict(policy.config.to_dict())
    config.num_labels = 1
    config.classifier_dropout = 0.0
    param = next(policy.parameters())
    critic = AutoModelForTokenClassification.from_config(config, dtype=param.dtype).to(param.device)
    body = getattr(critic, critic.base_model_prefix)
    body.load_state_dict(getattr(policy, policy.base_model_prefix).state_dict())
    with torch.no_grad():
        critic.score.weight.zero_()
        if critic.score.bias is not None:
            critic.score.bias.zero_()
    return critic


def response_values(critic: nn.Module, batch: TokenBatch) -> torch.Tensor:
    """V [N, T] (float32) of the response tokens of `batch`."""
    out = forward(critic, batch).logits  # [N, L, 1]
    return at_response(out, batch).squeeze(-1).float()


class Critic:
    """The value model and its optimizer (see the module docstring)."""

    def __init__(self, module: nn.Module, algo: AlgoConfig, micro_batch_size: int, autocast=contextlib.nullcontext):
        self.module = module
        self.autocast = autocast  # the forward passes' precision context (training/precision.py)
        self.algo = algo
        self.micro_batch_size = micro_batch_size
        self.lr = algo.critic_lr or algo.lr
        self.optimizer = torch.optim.AdamW(
            module.parameters(), lr=self.lr, betas=(algo.adam_beta1, algo.adam_beta2), eps=algo.adam_eps,
            weight_decay=algo.weight_decay,
        )

    def values(self, batch: TokenBatch) -> torch.Tensor:
        """Old values V_old [N, T] (no grad, micro-batched)."""
        self.module.eval()
        with self.autocast():
            return forward_only(lambda piece: response_values(self.module, piece), batch, self.micro_batch_size)
