"""The local spec's core attention with packed rows (qkv_format thd) taken as Transformer Engine takes them, and a
group's shared prompt computed once.

megatron-core 0.16's local ``DotProductAttention`` refuses ``packed_seq_params`` (dot_product_attention.py,
``assert packed_seq_params is None``), so packed micro-batches on the local spec used to carry a dense
block-diagonal [W, W] mask: every packed row paid attention over the whole pack (W^2 scores, a W x W mask per
micro-batch), most of it masked out. ``PackedDotProductAttention`` is the local core attention that also takes the
THD layout megatron's attention hands a core attention (attention.py: query/key/value squeezed to [t, heads, dim]):
causal attention inside each sequence of ``cu_seqlens_q`` by torch's scaled_dot_product_attention, grouped-query
heads shared as megatron's repeat_interleave shares them. Without ``packed_seq_params`` (bshd, padded rows with their
mask) it is megatron's DotProductAttention unchanged.

Shared prompts (``SharedPromptParams``, built by batching.packed for the local spec): a sequence of the pack may be a
unit [prompt][response 1]...[response G] of samples with the same prompt, where each response sees the prompt and its
own earlier tokens only, at the positions it has in its own sample (the prompt's length on): the prompt is computed
once for the G samples, as the torch trainer's packed units do (training/batch.py response_logits). Positions:
``PositionalRope`` makes the stage's RoPE table follow the micro-batch's position_ids token by token (megatron's
_apply_rotary_pos_emb_thd takes a table of one row per packed token at each sequence's offset), which for plain packed
samples equals megatron's own restart at each sequence.

The softmax runs in fp32 when ``attention_softmax_in_fp32`` (always set by model.transformer_config) and the inputs
are 16-bit, as megatron's FusedScaleMaskSoftmax does; attention dropout is 0 in every model miles builds (model.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention


@dataclass
class SharedPromptParams(PackedSeqParams):
    """PackedSeqParams (thd) whose sequence i is ``units[i]`` = (prompt length, response lengths): the prompt, then
    each response seeing the prompt and itself; a plain sample is (its length, ())."""

    units: tuple[tuple[int, tuple[int, ...]], ...] = ()


class PackedDotProductAttention(DotProductAttention):
    """DotProductAttention that also takes packed rows (qkv_format thd, cu_seqlens) and shared-prompt units."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None):
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                   attention_bias=attention_bias)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed rows in qkv_format {packed_seq_params.qkv_format!r}: the local spec's packed "
                             "attention takes thd only")
        if attention_bias is not None:
            raise ValueError("attention_bias is not supported by the local spec's attention")
        if packed_seq_params.cu_seqlens_q_padded is not None or packed_seq_params.cu_seqlens_kv_padded is not None:
            raise ValueError("padded cu_seqlens (context parallelism) are not supported by the local spec's attention")
        cu_q, cu_kv = packed_seq_params.cu_seqlens_q.tolist(), packed_seq_params.cu_seqlens_kv.tolist()
        if cu_q != cu_kv:
            raise ValueError("the local spec's packed attention is self-attention: cu_seqlens_q must equal cu_seqlens_kv")
        units = getattr(packed_seq_params, "units", ()) or tuple((e - s, ()) for s, e in zip(cu_q[:-1], cu_q[1:]))
        return packed_attention(query, key, value, cu_q, units, self.softmax_scale, upcast=self.config.attention_softmax_in_fp32)


@lru_cache(maxsize=256)
def unit_mask(prompt: int, responses: tuple[int, ...], device) -> torch.Tensor:
    """[L, L] True = attend: causal, and a response token sees the prompt and its own response only (cached: every
    layer of a micro-batch asks for the same masks)."""
    part = torch.repeat_interleave(torch.arange(len(responses) + 1, device=device),
                                   torch.tensor([prompt, *responses], device=device))  # [L] 0 = prompt, k = response k
    L = part.numel()
    return torch.ones((L, L), dtype=torch.bool, device=device).tril() & ((part[None, :] == 0) | (part[None, :] == part[:, None]))


def packed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: list[int],
                     units, scale: float, upcast: bool = True) -> torch.Tensor:
    """query [t, hq, d], key [t, hk, d], value [t, hk, dv] (hq a multiple of hk: query group g's heads share key
    head g) -> [t, hq, dv]: attention inside each sequence cu_seqlens[i]:cu_seqlens[i + 1], causal, or the shared-prompt
    mask of units[i] when it has responses."""
    dtype = query.dtype
    if upcast and dtype in (torch.bfloat16, torch.float16):
        query, key, value = query.float(), key.float(), value.float()
    q, k, v = (x.transpose(0, 1) for x in (query, key, value))  # [heads, t, dim]
    gqa = q.shape[0] > k.shape[0]
    outs = []
    for start, end, (prompt, responses) in zip(cu_seqlens[:-1], cu_seqlens[1:], units):
        if end == start:
            continue
        if prompt + sum(responses) != end - start:
            raise ValueError(f"packed sequence of {end - start} tokens described as a prompt of {prompt} and responses "
                             f"of {list(responses)}")
        qs, ks, vs = q[None, :, start:end], k[None, :, start:end], v[None, :, start:end]
        if len(responses) > 1:
            mask = unit_mask(prompt, responses, q.device)
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa)[0])
        else:  # one sample: plain causal attention
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa)[0])
    out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]  # [hq, t, dv]
    return out.transpose(0, 1).to(dtype)


class PositionalRope:
    """Installs on a GPTModel stage: its RoPE table follows the position_ids of each forward, one row per token
    (module docstring). A forward pre-hook takes position_ids ([1, W] packed, or [b, S] padded rows that all count
    0..S-1) and the stage's rotary embedding returns get_emb(max + 1)[positions]."""

    def __init__(self, stage):
        self.rope = stage.rotary_pos_emb
        self.positions: torch.Tensor | None = None
        self._forward = self.rope.forward
        self.rope.forward = self.forward
        stage.register_forward_pre_hook(self._take_positions, with_kwargs=True)

    def _take_positions(self, module, args, kwargs):
        pos = kwargs.get("position_ids")
        if pos is None and len(args) > 1:
            pos = args[1]
        self.positions = None if pos is None else (pos[0] if pos.shape[0] == 1 or bool((pos == pos[:1]).all()) else pos)
        if self.positions is not None and self.positions.dim() != 1:
            raise ValueError("position_ids of padded rows must count the same positions in every row (bshd)")

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group=None):
        if self.positions is None or offset:
            return self._forward(max_seq_len, offset, packed_seq, cp_group)
        emb = self._forward(int(self.positions.max()) + 1, 0, packed_seq, cp_group)  # [max + 1, 1, 1, d]
        return emb[self.positions]  # [W, 1, 1, d]
