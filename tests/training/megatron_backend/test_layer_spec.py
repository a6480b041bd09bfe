"""The one choice of layer spec (model.layer_spec) and what it changes in the batches: Transformer Engine's spec on CUDA
when it imports, the local one otherwise; packed micro-batches carry THD cu_seqlens for TE and the block-diagonal mask
for the local spec (the same rows, the same positions)."""

from __future__ import annotations

import pytest
import torch

from miles_core.training.batch import make_batch
from miles_core.training.megatron import batching
from miles_core.training.megatron.model import layer_spec


@pytest.mark.parametrize(("device", "te", "name"), [("cuda", True, "transformer_engine"), ("cuda", False, "local"),
                                                      ("cpu", True, "local"), ("cpu", False, "local")])
def test_the_spec_is_te_only_on_cuda_with_te(device, te, name):
    spec = layer_spec(device, te_available=te)
    assert spec.name == name and spec.use_transformer_engine == spec.thd == (name == "transformer_engine")


def test_thd_packing_gives_cu_seqlens_instead_of_the_mask(samples):
    batch = make_batch(samples, pad_id=0)
    rows = list(range(len(batch)))
    lengths = batch.attention_mask.sum(-1).tolist()
    masked = batching.plan(batch, rows, 3, max_tokens=max(lengths) * 3)
    thd = batching.plan(batch, rows, 3, max_tokens=max(lengths) * 3, thd=True)
    assert len(masked) == len(thd)
    for m, t in zip(masked, thd):
        assert m.rows == t.rows and torch.equal(m.input_ids, t.input_ids) and torch.equal(m.flat_index, t.flat_index)
        assert t.attention_mask is None and m.packed_seq_params is None
        row_lengths = [lengths[r] for r in t.rows]
        cu = torch.tensor([0, *row_lengths]).cumsum(0).to(torch.int32)
        p = t.packed_seq_params
        assert p.qkv_format == "thd" and torch.equal(p.cu_seqlens_q, cu) and torch.equal(p.cu_seqlens_kv, cu)
        assert p.max_seqlen_q == max(row_lengths) and t.input_ids.shape == (1, sum(row_lengths))
        # the mask the local spec gets says the same: sample i sees exactly its own earlier tokens
        seg = torch.repeat_interleave(torch.arange(len(row_lengths)), torch.tensor(row_lengths))
        visible = ~m.attention_mask[0, 0]
        assert torch.equal(visible, (seg[:, None] == seg[None, :]) & torch.ones_like(visible).tril())


def test_qkv_format_thd_packs_each_micro_batch_and_bshd_pads_it(samples):
    """The reference's --qkv-format without use_dynamic_batch_size: the same micro_batch_size rows per micro-batch,
    thd as one sequence [1, sum of lengths] with the block-diagonal mask, bshd right-padded [b, longest]."""
    batch = make_batch(samples, pad_id=0)
    rows = list(range(len(batch)))
    lengths = batch.attention_mask.sum(-1).tolist()
    thd = batching.plan(batch, rows, 3, None, qkv_format="thd")
    bshd = batching.plan(batch, rows, 3, None, qkv_format="bshd")
    assert [m.rows for m in thd] == [m.rows for m in bshd] and all(len(m.rows) <= 3 for m in thd)
    for t, b in zip(thd, bshd):
        row_lengths = [lengths[r] for r in t.rows]
        assert t.input_ids.shape == (1, sum(row_lengths)) and b.input_ids.shape == (len(t.rows), max(row_lengths))
        assert t.attention_mask.shape == (1, 1, sum(row_lengths), sum(row_lengths))
        # every response token is read at the same token in both layouts
        assert torch.equal(t.input_ids.reshape(-1)[t.flat_index], b.input_ids.reshape(-1)[b.flat_index])
    assert len(set(lengths)) > 1  # bshd pads some row: the two layouts differ
