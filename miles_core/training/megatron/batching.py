"""Rollout rows -> Megatron micro-batches, in the reference's two layouts (``qkv_format``).

thd (the default): each micro-batch's rows packed into one sequence [1, W] - ``micro_batch_size`` rows (after a
stable sort by length), or, with ``use_dynamic_batch_size``, rows packed up to ``max_tokens_per_gpu`` tokens -
with megatron's PackedSeqParams (qkv_format "thd", the rows' cu_seqlens), so no token is padding and none sees
another sample: Transformer Engine's attention takes them on GPU, the local spec's attention.PackedDotProductAttention
on CPU (attention inside each sequence; RoPE restarts at each sequence from cu_seqlens, megatron's rope_utils).
bshd: ``micro_batch_size`` rows right-padded to [b, S] with a causal mask over their real tokens (the reference's
bshd pads to the rollout's longest sample; padding after a sample's last token changes none of its scores).
Megatron's attention mask is boolean [b, 1, S, S], True = masked out. ``packed(..., thd=False)`` gives a packed row
the block-diagonal [W, W] mask instead of cu_seqlens, the layout megatron's own DotProductAttention computes: the
tests' oracle for the THD attention (W^2 scores per micro-batch: not a layout to train with).
Shared prompts (``share_prompts``: the local spec, not MLA): in a packed micro-batch the samples with the same prompt
(a group's G samples) form one THD sequence [prompt][response 1]...[response G], each response seeing the prompt and
itself at its own sample's positions (attention.SharedPromptParams, attention.PositionalRope), so the prompt is
computed once, not G times, as the torch trainer's packed units do; the same numbers up to float rounding. Rows keep
their order (a group's samples together) instead of the sort by length.
With use_dynamic_batch_size the rows are packed first-fit decreasing by tokens, or (balance_by_flops, ``workload``)
into ceil(tokens / max_tokens_per_gpu) Karmarkar-Karp partitions of near-equal estimated forward FLOPs.
``pad_to`` (tensor_model_parallel_size * data_pad_size_multiplier, the reference's get_batch pad_size): a packed
row gets a pad segment of its own up to a multiple of it (a THD cu_seqlens entry, as the reference), a padded
micro-batch's S is rounded up to one; no real token sees a pad token.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from functools import partial

import torch

from miles_core.training.batch import TokenBatch, karmarkar_karp, pack_rows, pad_columns, padded_to, prompt_units


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


def packed(batch: TokenBatch, rows: list[int], pad_to: int = 1, thd: bool = True, share_prompts: bool = False) -> MicroBatch:
    """rows packed into one sequence [1, W], each sample a THD sequence of its own; with ``share_prompts`` the samples
    with the same prompt form one sequence [prompt][response 1]...[response G] (attention.SharedPromptParams: each
    response sees the prompt and itself, at its own sample's positions), so their prompt is computed once."""
    piece = batch.take(rows)
    device = piece.input_ids.device
    lengths = piece.attention_mask.sum(-1).tolist()  # [n]
    if share_prompts:
        if not thd:
            raise ValueError("shared prompts need the THD layout (the local spec's attention.PackedDotProductAttention)")
        members, plen = prompt_units(piece)
    else:
        members, plen = [[i] for i in range(len(rows))], lengths
    tokens, resp_q = piece.input_ids.tolist(), piece.resp_index.clamp(min=0).tolist()  # [n, L], [n, T]
    ids: list[int] = []
    pos: list[int] = []
    flat: list[list[int]] = [[] for _ in rows]
    units: list[tuple[int, tuple[int, ...]]] = []
    for unit in members:
        o, p = len(ids), plen[unit[0]]
        if len(unit) == 1:  # one sample: the whole of it, a plain causal sequence
            i = unit[0]
            ids += tokens[i][: lengths[i]]
            pos += range(lengths[i])
            flat[i] = [o + q for q in resp_q[i]]
            units.append((lengths[i], ()))
            continue
        ids += tokens[unit[0]][:p]
        pos += range(p)
        for i in unit:
            start, r = len(ids), lengths[i] - p
            ids += tokens[i][p : p + r]
            pos += range(p, p + r)
            flat[i] = [o + q if q < p else start + q - p for q in resp_q[i]]  # q: the position in sample i's own sequence
        units.append((p, tuple(lengths[i] - p for i in unit)))
    extra = padded_to(len(ids), pad_to) - len(ids)  # data_pad_size_multiplier: a pad segment of its own after them
    if extra:
        ids += [0] * extra
        pos += range(extra)
        units.append((extra, ()))
    seq_lengths = [p + sum(r) for p, r in units]
    ids_t = torch.tensor(ids, dtype=torch.long, device=device)[None]  # [1, W]
    pos_t = torch.tensor(pos, dtype=torch.long, device=device)[None]  # [1, W] each token's position in its own sample
    flat_t = torch.tensor(flat, dtype=torch.long, device=device)  # [n, T]
    if thd:
        mask, params = None, thd_params(seq_lengths, device, tuple(units) if share_prompts else None)
    else:
        mask, params = block_causal_mask(seq_lengths, device), None
    return MicroBatch(rows=list(rows), input_ids=ids_t, position_ids=pos_t, attention_mask=mask, flat_index=flat_t,
                      resp_tokens=piece.resp_tokens, loss_mask=piece.loss_mask, rollout_log_probs=piece.rollout_log_probs,
                      packed_seq_params=params)


def block_causal_mask(lengths: list[int], device) -> torch.Tensor:
    """[1, 1, W, W] True = masked: each packed sample sees its own earlier tokens only."""
    W = sum(lengths)
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))  # [W]
    visible = (seg[:, None] == seg[None, :]) & torch.ones((W, W), dtype=torch.bool, device=device).tril()  # [W, W]
    return ~visible[None, None]


def thd_params(lengths: list[int], device, units=None):
    """megatron's PackedSeqParams for sequences of ``lengths`` packed back to back (qkv_format thd, cu_seqlens int32
    [n + 1]); with ``units`` (prompt length, response lengths) per sequence, attention.SharedPromptParams."""
    from megatron.core.packed_seq_params import PackedSeqParams

    from .attention import SharedPromptParams

    cu = torch.tensor([0, *lengths], dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    common = dict(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
    return PackedSeqParams(**common) if units is None else SharedPromptParams(**common, units=units)


def plan(batch: TokenBatch, rows: list[int], micro_batch_size: int, max_tokens: int | None, qkv_format: str = "thd",
         pad_to: int = 1, workload=None, thd: bool = True, share_prompts: bool = False) -> list[MicroBatch]:
    """rows as micro-batches (module docstring): packed into at most max_tokens tokens each when given, else
    micro_batch_size per micro-batch (after a stable sort by length; in the rows' order with ``share_prompts``, which
    keeps a group's samples together), each packed (qkv_format thd) or padded (bshd); packed rows carry THD cu_seqlens,
    or with ``thd=False`` the block-diagonal mask (the tests' oracle); ``share_prompts``: packed()."""
    lengths = batch.attention_mask.sum(-1).tolist()  # [N]
    if max_tokens is not None:
        longest = max(lengths[r] for r in rows)
        if longest > max_tokens:
            raise ValueError(f"a sample of {longest} tokens does not fit max_tokens_per_gpu ({max_tokens}); raise it")
        mine = [lengths[r] for r in rows]
        groups = pack_rows(mine, max_tokens) if workload is None else flops_groups(mine, max_tokens, workload)
        return [packed(batch, [rows[i] for i in sorted(group)], pad_to, thd, share_prompts) for group in groups]
    thd_packs = qkv_format == "thd"
    order = list(rows) if share_prompts and thd_packs else sorted(rows, key=lambda r: lengths[r])
    groups = [order[s : s + micro_batch_size] for s in range(0, len(order), micro_batch_size)]
    if thd_packs:
        return [packed(batch, group, pad_to, thd, share_prompts) for group in groups]
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
        with output_at_responses(module, mb) as indexed:
            out = module(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=mb.attention_mask,
                         packed_seq_params=mb.packed_seq_params)
        return out, partial(loss_fn, indexed)

    return get_forward_backward_func()(
        forward_step_func=step, data_iterator=iter(mbs), model=[stage], num_microbatches=len(mbs),
        seq_length=max(mb.input_ids.shape[1] for mb in mbs), micro_batch_size=max(mb.input_ids.shape[0] for mb in mbs),
        forward_only=forward_only,
    ) or []


@contextlib.contextmanager
def output_at_responses(module, mb: MicroBatch):
    """The stage's output layer (the LM head, the critic's value head) computed only at the positions mb's flat_index
    names, not at every position of the sequence (prompts, pad segments): a forward pre-hook hands it those rows of
    the hidden states, [S, b, h] -> [n * T, 1, h], so the stage returns [1, n * T, D]. Yields the micro-batch whose
    flat_index indexes that output (arange), for the loss. Same values as the full output at those positions (a
    row-wise linear layer). Not on a stage without the output layer (pipeline stages before the last), under
    sequence parallelism (each rank holds a slice of the sequence), with MTP (its own output-layer calls), or where
    n x T is not fewer than the sequence's positions: there it yields mb as it is."""
    gpt = module
    while gpt is not None and not hasattr(gpt, "output_layer"):  # megatron's wrappers (DDP, Float16Module) hold .module
        gpt = getattr(gpt, "module", None)
    layer = None if gpt is None else gpt.output_layer
    index = mb.flat_index.reshape(-1)
    if layer is None or getattr(layer, "sequence_parallel", False) or getattr(gpt, "mtp_process", False) \
            or index.numel() >= mb.input_ids.numel():  # n x T (T: the longest response) can exceed short packed rows
        yield mb
        return

    def pick(_layer, args, kwargs):
        hidden = args[0]  # [S, b, h] (megatron's sequence-major layout); flat_index counts b-major: b * S + s
        return (hidden.transpose(0, 1).reshape(-1, hidden.shape[-1])[index][:, None], *args[1:]), kwargs

    handle = layer.register_forward_pre_hook(pick, with_kwargs=True)
    try:
        yield replace(mb, flat_index=torch.arange(index.numel(), device=index.device).view_as(mb.flat_index))
    finally:
        handle.remove()


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
