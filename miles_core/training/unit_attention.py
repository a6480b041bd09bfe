"""Attention per packed unit for the torch trainer's packed rows (training/batch.py ``response_logits``).

A packed row holds several units (a group: its prompt once, then its responses) under one block-diagonal [W, W]
mask; SDPA with a mask computes every query against every key of the row, so a row of two 128-token units costs
twice the scores of the units alone (four units: four times). ``unit_attention`` computes each unit's block on
its own (the unit's slice of q, k, v and of the mask); an empty slot, a unit of its own that sees only itself, gets
its value. The numbers are those of the full-row SDPA at every slot up to float rounding: a masked key contributes
exp(-inf) = 0 either way (tests/training/test_unit_attention.py).

It is a transformers attention function (``AttentionInterface``), used only inside ``units_attention(model)``
with the units passed as the forward's ``miles_units`` keyword; any other call falls back to transformers' SDPA.
``worth_it`` picks it where it was measured to pay (docs/performance.md, "What makes a step cheaper").
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "miles_units"


def unit_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                   miles_units: list[list[tuple[int, int]]] | None = None, **kwargs):
    """query [R, heads, W, d], key / value [R, kv_heads, W, d], attention_mask [R, 1, W, W] (bool, True = attend);
    miles_units: per row, the (start, end) column span of each unit -> ([R, W, heads, d], None) as transformers' SDPA."""
    if miles_units is None or dropout > 0.0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    W = query.shape[2]
    rep = query.shape[1] // key.shape[1]  # query heads per K/V head (GQA; transformers' repeat_kv order)
    rows = []
    for r, (q, k, v, spans) in enumerate(zip(query.unbind(0), key.unbind(0), value.unbind(0), miles_units)):
        sizes, units, at = [], [], 0  # the row cut into pieces: each unit, and each run of empty slots between them
        for s, e in [*spans, (W, W)]:
            if s > at:
                sizes.append(s - at), units.append(None)
            if e > s:
                sizes.append(e - s), units.append((s, e))
            at = e
        # Views by unbind / split: their backward is one stack / cat per tensor; a slice per unit would zero-fill
        # a full-size gradient for each unit (measured: 20% of a SmolLM2 train step).
        pieces = []
        for unit, qp, kp, vp in zip(units, q.split(sizes, 1), k.split(sizes, 1), v.split(sizes, 1)):
            if unit is None:  # empty slots: each attends to itself alone (its own unit), so its output is its value
                pieces.append(vp.repeat_interleave(rep, dim=0))
            else:
                s, e = unit
                mask = attention_mask[r : r + 1, :, s:e, s:e]
                pieces.append(F.scaled_dot_product_attention(qp[None], kp[None], vp[None], attn_mask=mask, scale=scaling,
                                                             enable_gqa=rep > 1)[0])
        rows.append(torch.cat(pieces, dim=1))  # [heads, W, d]
    return torch.stack(rows).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, unit_attention)


def worth_it(model, unit_lengths: list[int], rows: int, width: int) -> bool:
    """Per-unit attention where it pays: the model on transformers' SDPA, its layers not compiled (torch_compile), and
    the units' scores at most half the rows'
    (sum of len^2 <= rows * W^2 / 2). Measured train steps, units vs rows where chosen: SmolLM2 4x4x32 8.25 vs 8.42 s,
    tiny 8x4x32 0.129 vs 0.146 s, tiny 16x8x128 0.439 vs 0.453 s (the per-unit calls cost less than the scores saved
    even at the tiny model's 35-token units)."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or not unit_lengths:
        return False
    if getattr(model, "miles_compiled_layers", False):  # torch_compile: a loop over this step's spans would recompile
        return False
    return 2 * sum(n * n for n in unit_lengths) <= rows * width * width


@contextlib.contextmanager
def units_attention(model):
    """The model's attention is ``unit_attention`` inside (transformers reads config._attn_implementation per call)."""
    config = model.config
    saved = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = saved
