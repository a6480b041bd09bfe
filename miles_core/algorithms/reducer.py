"""Reduction R of a per-token quantity to the scalar of one optimizer step (REFERENCE §3).

    default (per-sample mean):  R(x) = sum_i [ sum_t x_it m_it / max(sum_t m_it, 1) ] / num_samples
    calculate_per_token_loss:   R(x) = sum_it x_it m_it / num_tokens

num_samples is the global batch size of the optimizer step and num_tokens the total mask sum over the
whole step (all micro-batches, all ranks), so R is *additive*: summing R over the micro-batches of a
step gives the value R would give on the whole step at once. The trainer therefore sums every metric
(and accumulates gradients) over micro-batches without rescaling.

Departure: with the default mode a sample whose mask is all zero still counts in num_samples (it
contributes 0), exactly like a sample of the reference whose tokens are all masked.
"""

from __future__ import annotations

from torch import Tensor

from .ops import broadcast_tokens, masked_sum


class Reducer:
    """R(x, mask) -> scalar. Holds the global denominators of one optimizer step."""

    def __init__(self, per_token: bool, num_samples: int, num_tokens: float):
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1 (global batch size), got {num_samples}")
        self.per_token = per_token
        self.num_samples = int(num_samples)
        self.num_tokens = max(float(num_tokens), 1.0)

    def __call__(self, x: Tensor, mask: Tensor) -> Tensor:
        """x, mask [N, T] -> scalar."""
        if self.per_token:
            return masked_sum(x, mask) / self.num_tokens
        per_sample = masked_sum(x, mask, dim=-1) / mask.sum(dim=-1).clamp(min=1.0)  # [N]
        return per_sample.sum() / self.num_samples

    def per_sample(self, values: Tensor, mask: Tensor) -> Tensor:
        """R of a per-sample quantity [N] (each token of sample i carries values[i])."""
        return self(broadcast_tokens(values, mask), mask)

    def normalize(self, total: Tensor) -> Tensor:
        """A sum over this micro-batch's samples divided by the step's denominator (num_tokens with per_token,
        else num_samples): how the reference normalises a metric it reports as a plain sum (opsm_clipfrac)."""
        return total / (self.num_tokens if self.per_token else self.num_samples)

    def share(self, mask: Tensor) -> Tensor:
        """This micro-batch's share of the step: R(1). Sums to 1 over a step with no empty sample."""
        return self(mask.new_ones(mask.shape), mask)

    def __repr__(self) -> str:
        return f"Reducer(per_token={self.per_token}, num_samples={self.num_samples}, num_tokens={self.num_tokens})"
