"""Data parallel for the torch trainer over a torch.distributed group (gloo on CPU): the trainer's ``dp`` hook.

Every rank receives the whole rollout and computes the forward-only passes and advantages on all
of it (so advantages, group statistics and the Reducer's global denominators are exactly those of
one process). Each optimizer step then runs forward/backward on this rank's share of the global
batch only, and the gradients and metric totals are summed over ranks (one all-reduce) before
clipping and the optimizer step: every rank applies the same update, so the replicas stay equal.

Shares: ``balance_data`` splits the rows of a global batch by token count (longest first onto the
lightest rank), else in contiguous blocks. Rows are sorted within a rank (micro-batches keep order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def split_rows(rows: range, lengths: list[int], world: int, balance: bool) -> list[list[int]]:
    """rows of a global batch -> one sorted list per rank. balance: greedy by length (longest first,
    lightest rank; ties: lower rank), else contiguous blocks (sizes differ by at most one)."""
    rows = list(rows)
    if not balance:
        q, r = divmod(len(rows), world)
        starts = [k * q + min(k, r) for k in range(world + 1)]
        return [rows[starts[k] : starts[k + 1]] for k in range(world)]
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(rows, key=lambda i: (-lengths[i], i)):
        k = min(range(world), key=lambda k: (load[k], len(shares[k]), k))
        shares[k].append(i)
        load[k] += lengths[i]
    return [sorted(s) for s in shares]


@dataclass
class GlooDataParallel:
    """The trainer's ``dp`` hook (TorchTrainer._actor_step)."""

    rank: int
    world: int
    balance: bool

    def shard(self, batch, rows: range) -> list[int]:
        lengths = batch.attention_mask.sum(-1).tolist()
        return split_rows(rows, lengths, self.world, self.balance)[self.rank]

    def all_reduce(self, model: torch.nn.Module, metrics: dict[str, float]) -> dict[str, float]:
        import torch.distributed as dist

        params = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        names = sorted(metrics)
        totals = torch.tensor([metrics[k] for k in names], dtype=grads[0].dtype, device=grads[0].device)  # with the grads (NCCL: GPU)
        flat = torch.cat([g.reshape(-1) for g in grads] + [totals])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads):
            p.grad = flat[offset : offset + g.numel()].view_as(g).clone()
            offset += g.numel()
        return {k: float(v) for k, v in zip(names, flat[offset:])}
