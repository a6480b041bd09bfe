"""Rollout rows -> Megatron micro-batches, in the reference's two layouts (``qkv_format``).

thd (the default): each micro-batch's rows packed into one sequence [1, W] - ``micro_batch_size`` rows (after a
stable sort by length), or, with ``use_dynamic_batch_size``, rows packed up to ``max_tokens_per_gpu`` tokens -
with a block-diagonal causal mask, so no token is padding and none sees another sample. (On GPU, Transformer
Engine's attention takes the same packing as THD with cu_seqlens; the local CPU spec takes the mask: ``plan(...,
thd=True)`` gives packed micro-batches megatron's PackedSeqParams with qkv_format "thd" and the rows' cu_seqlens
instead of the [W, W] mask, for the Transformer-Engine spec.) bshd: ``micro_batch_size`` rows right-padded to
[b, S] with a causal mask over their real tokens (the reference's bshd pads to the rollout's longest sample;
padding after a sample's last token changes none of its scores). RoPE is relative, so a sample's scores do not
depend on where in the packed row it starts. Megatron's attention mask is boolean [b, 1, S, S], True = masked out.
With use_dynamic_batch_size the rows are packed first-fit decreasing by tokens, or (balance_by_flops, ``workload``)
into ceil(tokens / max_tokens_per_gpu) Karmarkar-Karp partitions of near-equal estimated forward FLOPs.
``pad_to`` (tensor_model_parallel_size * data_pad_size_multiplier, the reference's get_batch pad_size): a packed
row gets a pad segment of its own up to a multiple of it (a THD cu_seqlens entry, as the reference), a padded
micro-batch's S is rounded up to one; no real token sees a pad token.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from miles_core.training.batch import TokenBatch, karmarkar_karp, pack_rows, pad_columns, padded_to


@dataclass(frozen=True)
class MicroBatch:
    """rows: the samples (rollout batch rows, n of them) it holds; flat_index [n, T] the positions in the
    flattened [b * S] sequence whose logits predict each response token; T = the rows' longest response."""

    rows: list[int]
    input_ids: torch.Tensor  # [b, S]
    position_ids: torch.Tensor  # [b, S]
    attention_mask: torch.Tensor | None  # [b, 1, S, S] True = masked; None with packed_seq_params
    flat_index: torch.Tensor  # [n, T]
    resp_tokens: torch.Tensor  # [n, T]
    loss_mask: torch.Tensor  # [n, T]
    rollout_log_probs: torch.Tensor  # [n, T]
    packed_seq_params: object = None  # megatron's PackedSeqParams (THD: cu_seqlens [n + 1]), packed rows on the TE spec


def padded(batch: TokenBatch, rows: list[int], pad_to: int = 1) -> MicroBatch:
    piece = pad_columns(batch.take(rows), pad_to)  # S a multiple of pad_to: the extra columns are masked keys
    n, S = piece.input_ids.shape
    device = piece.input_ids.device
    causal = torch.ones((S, S), dtype=torch.bool, device=device).tril()
    visible = causal[None] & piece.attention_mask.bool()[:, None, :]  # [n, S(query), S(key)]
    flat = torch.arange(n, device=device)[:, None] * S + piece.resp_index.clamp(min=0)  # [n, T]
    return MicroBatch(rows=list(rows), input_ids=piece.input_ids, position_ids=torch.arange(S, device=device).expand(n, S),
                      attention_mask=~visible[:, None], flat_index=flat, resp_tokens=piece.resp_tokens,
                      loss_mask=piece.loss_mask, rollout_log_probs=piece.rollout_log_probs)


def packed(batch: TokenBatch, rows: list[int], thd: bool = False, pad_to: int = 1) -> MicroBatch:
    piece = batch.take(rows)
    device = piece.input_ids.device
    lengths = piece.attention_mask.sum(-1).tolist()  # [n]
    starts = torch.tensor([0, *lengths[:-1]], device=device).cumsum(0)  # [n]
    flat = starts[:, None] + piece.resp_index.clamp(min=0)  # [n, T]
    extra = padded_to(sum(lengths), pad_to) - sum(lengths)  # data_pad_size_multiplier: a pad segment of its own after them
    seqs = [piece.input_ids[i, :n] for i, n in enumerate(lengths)]
    if extra:
        seqs.append(torch.zeros(extra, dtype=torch.long, device=device))
        lengths = [*lengths, extra]
    ids = torch.cat(seqs)[None]  # [1, W]
    pos = torch.cat([torch.arange(n, device=device) for n in lengths])[None]  # [1, W] each sample's own positions
    mask, params = (None, thd_params(lengths, device)) if thd else (block_causal_mask(lengths, device), None)
    return MicroBatch(rows=list(rows), input_ids=ids, position_ids=pos, attention_mask=mask, flat_index=flat,
                      resp_tokens=piece.resp_tokens, loss_mask=piece.loss_mask, rollout_log_probs=piece.rollout_log_probs,
                      packed_seq_params=params)


def block_causal_mask(lengths: list[int], device) -> torch.Tensor:
    """[1, 1, W, W] True = masked: each packed sample sees its own earlier tokens only."""
    W = sum(lengths)
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))  # [W]
    visible = (seg[:, None] == seg[None, :]) & torch.ones((W, W), dtype=torch.bool, device=device).tril()  # [W, W]
    return ~visible[None, None]


def thd_params(lengths: list[int], device):
    """megatron's PackedSeqParams for rows of ``lengths`` packed back to back (qkv_format thd, cu_seqlens int32 [n + 1])."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor([0, *lengths], dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))


def plan(batch: TokenBatch, rows: list[int], micro_batch_size: int, max_tokens: int | None, thd: bool = False,
         qkv_format: str = "thd", pad_to: int = 1, workload=None) -> list[MicroBatch]:
    """rows as micro-batches (module docstring): packed into at most max_tokens tokens each when given, else
    micro_batch_size per micro-batch after a stable sort by length, each packed (qkv_format thd) or padded (bshd);
    packed rows carry THD cu_seqlens with ``thd``, else the block-diagonal mask."""
    lengths = batch.attention_mask.sum(-1).tolist()  # [N]
    if max_tokens is not None:
        longest = max(lengths[r] for r in rows)
        if longest > max_tokens:
            raise ValueError(f"a sample of {longest} tokens does not fit max_tokens_per_gpu ({max_tokens}); raise it")
        mine = [lengths[r] for r in rows]
        groups = pack_rows(mine, max_tokens) if workload is None else flops_groups(mine, max_tokens, workload)
        return [packed(batch, [rows[i] for i in sorted(group)], thd, pad_to) for group in groups]
    order = sorted(rows, key=lambda r: lengths[r])
    groups = [order[s : s + micro_batch_size] for s in range(0, len(order), micro_batch_size)]
    if qkv_format == "thd":
        return [packed(batch, group, thd, pad_to) for group in groups]
    return [padded(batch, group, pad_to) for group in groups]


def flops_groups(lengths: list[int], max_tokens: int, workload) -> list[list[int]]:
    """balance_by_flops: ceil(tokens / max_tokens) micro-batches (one per sample when that is not fewer than the
    samples) of near-equal estimated FLOPs, Karmarkar-Karp over ``workload(length)``, as the reference's
    build_dp_schedule (its token cap per micro-batch is not enforced either)."""
    count = max(1, -(-sum(lengths) // max_tokens))
    if count >= len(lengths):
        return [[i] for i in range(len(lengths))]
    return karmarkar_karp([workload(n) for n in lengths], count)


def run(stage, mbs: list[MicroBatch], loss_fn, forward_only: bool) -> list[dict]:
    """megatron's forward-backward schedule over micro-batches; loss_fn(mb, out [b, S, D]) -> (loss, count, dict);
    -> the dicts (last pipeline stage; [] elsewhere)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def step(data_iterator, module):
        mb = next(data_iterator)
        out = module(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=mb.attention_mask,
                     packed_seq_params=mb.packed_seq_params)
        return out, partial(loss_fn, mb)

    return get_forward_backward_func()(
        forward_step_func=step, data_iterator=iter(mbs), model=[stage], num_microbatches=len(mbs),
        seq_length=max(mb.input_ids.shape[1] for mb in mbs), micro_batch_size=max(mb.input_ids.shape[0] for mb in mbs),
        forward_only=forward_only,
    ) or []


def count(out: torch.Tensor) -> torch.Tensor:
    """The token count a loss function hands megatron's schedule (1: the Reducer's denominators are global), on out's device."""
    return torch.ones((), dtype=torch.int, device=out.device)


@torch.no_grad()
def forward_only(stage, batch: TokenBatch, mbs: list[MicroBatch], fn) -> torch.Tensor | None:
    """fn(mb, out) -> [n, t] per micro-batch, gathered into [N, T] over batch's rows (last stage; None elsewhere)."""
    stage.eval()
    results = run(stage, mbs, lambda mb, out: (out.new_zeros(()), count(out), {"rows": mb.rows, "x": fn(mb, out)}), True)
    if not results:
        return None
    out = torch.zeros_like(batch.loss_mask)  # [N, T]
    for r in results:
        out[r["rows"], : r["x"].shape[1]] = r["x"]
    return out
