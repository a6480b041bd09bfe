"""A TIS function written for the reference system, run through our TIS signature (tis.py).

The reference calls ``fn(args=..., pg_loss=..., train_log_probs=[...], rollout_log_probs=[...], loss_masks=[...],
total_lengths=..., response_lengths=[...], parallel_state=..., max_seq_lens=None)`` with one 1-D tensor per
sample (its response tokens) and gets back ``(pg_loss, modified_masks, metrics)``: the corrected per-token
loss (flat), one mask per sample, and flat per-token metric tensors that it reduces over the original masks.

Here (a function whose first parameter is named ``args``):
- ``args`` = the algorithm fields plus the ``custom_config_path`` keys, by the reference's names;
- ``pg_loss`` = ones, so the returned ``pg_loss`` is the per-token weight (every IS correction multiplies the
  loss; a correction that does not is not supported);
- sample i's tensors are its first L_i positions, L_i = 1 + its last trainable position;
- ``total_lengths`` = None (our trainer does not pack prompts with responses here), ``parallel_state`` has a
  context-parallel group of size 1 (``parallel_state.cp.size == 1``), ``max_seq_lens`` = None;
- each returned metric (flat or a list of per-sample tensors) is reduced with R over the original mask.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from miles_core.resolve import reference_args

from .tis import TISFunction, TISInputs

SINGLE_RANK = types.SimpleNamespace(size=1, rank=0, group=None)
PARALLEL_STATE = types.SimpleNamespace(cp=SINGLE_RANK, dp=SINGLE_RANK, tp=SINGLE_RANK)


def lengths_of(mask: Tensor) -> list[int]:
    """1 + the last position with mask > 0, per row (0 for an empty row). [N, T] -> N ints."""
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device).expand_as(mask)  # [N, T]
    return torch.where(mask > 0, positions, 0).amax(dim=-1).tolist()


def unflatten(values: Tensor | list[Tensor], lengths: list[int], like: Tensor) -> Tensor:
    """Per-sample 1-D tensors (a list, or one flat tensor of sum(lengths)) -> right-padded [N, T] like ``like``."""
    pieces = list(values) if isinstance(values, (list, tuple)) else torch.split(values.reshape(-1), lengths)
    out = torch.zeros_like(like)
    for i, (piece, n) in enumerate(zip(pieces, lengths)):
        out[i, :n] = piece.reshape(-1)[:n].to(like.dtype)
    return out


def adapt(fn: Callable[..., Any]) -> TISFunction:
    """Wrap a reference-style TIS function (module docstring) as fn(inputs) -> (weights, mask, metrics)."""

    def reference_tis(inputs: TISInputs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        mask = inputs.loss_mask
        lengths = lengths_of(mask)
        rows = lambda x: [x[i, :n] for i, n in enumerate(lengths)]  # noqa: E731
        args = reference_args(**{**inputs.algo.model_dump(), **inputs.options})
        pg_loss, masks, metrics = fn(
            args=args, pg_loss=torch.ones(sum(lengths), dtype=mask.dtype, device=mask.device),
            train_log_probs=rows(inputs.old_log_probs), rollout_log_probs=rows(inputs.rollout_log_probs),
            loss_masks=rows(mask), total_lengths=None, response_lengths=lengths, parallel_state=PARALLEL_STATE,
            max_seq_lens=None,
        )
        weights, kept = unflatten(pg_loss, lengths, mask), unflatten(masks, lengths, mask) * mask
        reduced = {name: inputs.reduce(unflatten(v, lengths, mask), mask) for name, v in (metrics or {}).items()}
        return weights, kept, reduced

    return reference_tis
