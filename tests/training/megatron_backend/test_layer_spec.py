"""The one choice of layer spec (model.layer_spec): Transformer Engine's spec on CUDA when it imports, the local one
otherwise; packed micro-batches carry THD cu_seqlens for both (the same rows as the block-diagonal mask megatron's own
DotProductAttention takes, the tests' oracle); the local spec's THD attention (attention.PackedDotProductAttention)
against that oracle and against the HF model."""

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
    assert spec.name == name and spec.use_transformer_engine == (name == "transformer_engine")


def test_thd_packing_gives_cu_seqlens_instead_of_the_mask(samples):
    batch = make_batch(samples, pad_id=0)
    rows = list(range(len(batch)))
    lengths = batch.attention_mask.sum(-1).tolist()
    masked = batching.plan(batch, rows, 3, max_tokens=max(lengths) * 3, thd=False)
    thd = batching.plan(batch, rows, 3, max_tokens=max(lengths) * 3)
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
    thd as one sequence [1, sum of lengths] with its cu_seqlens, bshd right-padded [b, longest] with a mask."""
    batch = make_batch(samples, pad_id=0)
    rows = list(range(len(batch)))
    lengths = batch.attention_mask.sum(-1).tolist()
    thd = batching.plan(batch, rows, 3, None, qkv_format="thd")
    bshd = batching.plan(batch, rows, 3, None, qkv_format="bshd")
    assert [m.rows for m in thd] == [m.rows for m in bshd] and all(len(m.rows) <= 3 for m in thd)
    for t, b in zip(thd, bshd):
        row_lengths = [lengths[r] for r in t.rows]
        assert t.input_ids.shape == (1, sum(row_lengths)) and b.input_ids.shape == (len(t.rows), max(row_lengths))
        assert t.attention_mask is None and t.packed_seq_params.cu_seqlens_q.tolist()[-1] == sum(row_lengths)
        assert b.attention_mask.shape == (len(t.rows), 1, max(row_lengths), max(row_lengths))
        # every response token is read at the same token in both layouts
        assert torch.equal(t.input_ids.reshape(-1)[t.flat_index], b.input_ids.reshape(-1)[b.flat_index])
    assert len(set(lengths)) > 1  # bshd pads some row: the two layouts differ


@pytest.mark.parametrize("kind", ["qwen2", "glm4_moe"])  # glm4_moe: partial rotary (half the head), qk norm, MoE
def test_the_local_specs_thd_attention_and_shared_prompts_equal_megatrons_masked_attention(megatron_world, tmp_path, cfg,
                                                                                          samples, kind):
    """The same micro-batches (with a pad segment) through the local spec three ways: one sequence under the
    block-diagonal mask (megatron's own DotProductAttention: the oracle), each sample a THD sequence
    (attention.PackedDotProductAttention), and a group's samples one THD sequence sharing their prompt
    (SharedPromptParams, RoPE from position_ids): equal log-probs, so no token attends across its sample's bounds and
    every response token sits at its own sample's position; the shared layout is shorter by the repeated prompts.
    (test_trainer.py holds the step against the HF model through the torch trainer.)"""
    from miles_core.training.megatron.attention import PackedDotProductAttention, SharedPromptParams
    from miles_core.training.megatron.trainer import MegatronTrainer

    from .conftest import tiny_hf

    tiny_hf(kind).save_pretrained(tmp_path)
    trainer = MegatronTrainer(cfg(data_pad_size_multiplier=16, micro_batch_size=4), tmp_path, pad_id=0)
    engine = trainer.engine
    assert engine.share_prompts
    attention = [m for m in engine.model.modules() if type(m).__name__.endswith("DotProductAttention")]
    assert attention and all(isinstance(m, PackedDotProductAttention) for m in attention)
    batch = make_batch(samples, pad_id=0)
    rows = list(range(len(batch)))
    out, width = {}, {}
    for layout, kw in {"mask": dict(thd=False), "thd": {}, "shared": dict(share_prompts=True)}.items():
        mbs = batching.plan(batch, rows, 4, None, pad_to=16, **kw)
        assert all(mb.input_ids.shape[-1] % 16 == 0 for mb in mbs) and any(len(mb.rows) > 1 for mb in mbs)
        width[layout] = sum(mb.input_ids.shape[-1] for mb in mbs)
        if layout == "shared":
            assert all(isinstance(mb.packed_seq_params, SharedPromptParams) for mb in mbs)
            assert any(len(r) > 1 for mb in mbs for _, r in mb.packed_seq_params.units)  # a prompt shared by samples
        out[layout] = batching.forward_only(engine.model, batch, mbs, lambda mb, o: engine._response_logits(mb, o).log_softmax(-1)
                                            .gather(-1, mb.resp_tokens.clamp(min=0)[..., None])[..., 0])
    assert width["shared"] < width["thd"] == width["mask"]
    mask = batch.loss_mask.bool()
    for layout in ("thd", "shared"):
        torch.testing.assert_close(out[layout][mask], out["mask"][mask], rtol=1e-5, atol=1e-5)
