"""The torch engine's parallel strategies: ``SingleProcess`` (one process, does nothing) and ``FSDPDataParallel``
(data parallel over a torch.distributed group, FSDP2), given to the engine at construction (torch_trainer.py).

The policy (and the PPO critic) is sharded with ``torch.distributed.fsdp.fully_shard`` (FSDP2), one
unit per decoder layer plus the root, on CPU with gloo as on CUDA with NCCL (measured: docs/decisions.md,
2026-12-01). There is no config field for it: the reference system has no FSDP flag, so a torch
trainer on more than one Ray rank always runs this.

- Forward-only passes (old log-probs, ref, teacher, critic values): each rank computes its share of
  the rollout's rows (``split_rows``), then an all-gather gives every rank the whole [N, T] tensors,
  so advantages and group statistics are exactly those of one process.
- Optimizer steps: each rank runs forward/backward on its share of the global batch; FSDP2 sums the
  gradients over ranks (reduce-scatter with SUM, no division: the Reducer's denominators are global,
  so the sum of the ranks' losses is the one-process loss) and the metric totals are summed with one
  all-reduce. Every rank then clips and steps its shard: one update, as one process would make.
- FSDP2 all-gathers a unit's parameters in every forward, so every rank must run the same number of
  passes: forward-only shares are padded to one row count (copies of a real row, dropped before the
  gather), and a rank with fewer training micro-batches runs zero-weighted ones (``reduce_step``).
- Weights, checkpoints and exports read full HF-named tensors gathered from the shards on every rank
  (the trainer is then ``collective``: the train group calls every rank, rank 0 writes).

Shares: ``balance_data`` splits the rows by token count (longest first onto the lightest rank), else
in contiguous blocks. Rows are sorted within a rank (micro-batches keep order).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from .batch import PACKED_FORWARD, TokenBatch, packed_logits


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


def as_float(norm: torch.Tensor) -> float:
    """A grad norm as a float (under FSDP2, clip_grad_norm_ returns a replicated DTensor)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def fully_shard_model(module: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 over the default process group: each decoder layer a unit, the rest in the root unit;
    gradients summed over ranks. The packed forward (batch.packed_logits) is registered as a forward
    of the root, so it gathers the root's parameters (embeddings, norm, head) like ``forward``."""
    import types

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    param = next(module.parameters())
    mesh = init_device_mesh(param.device.type, (dist.get_world_size(),))
    body = getattr(module, "base_model", module)
    for layer in getattr(body, "layers", []):
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    for unit in (m for m in module.modules() if hasattr(m, "set_gradient_divide_factor")):
        unit.set_gradient_divide_factor(1.0)  # a sum over ranks, not a mean
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    setattr(module, PACKED_FORWARD, types.MethodType(packed_logits, module))
    register_fsdp_forward_method(module, PACKED_FORWARD)
    return module


class SingleProcess:
    """The torch engine's parallel strategy in one process: every row here, nothing to gather or shard."""

    rank, world, collective, whole_batch = 0, 1, False, True

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def shard(self, batch: TokenBatch, rows: range, size: int) -> tuple[list[int], int]:
        return list(rows), 0

    def reduce_step(self, metrics: dict[str, float], pad: int, dummy: Callable[[], torch.Tensor]) -> dict[str, float]:
        return metrics

    def forward_only(self, fn: Callable, batch: TokenBatch, samples: list):
        return fn(batch, samples)

    def full_state(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        return module.state_dict()

    def full_model(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def checkpoint_parts(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """(module, optimizer) as the checkpoint code reads and loads them."""
        return module, optimizer

    def gather_for_save(self, parts: list) -> None:
        """Nothing to gather before rank 0 writes."""


@dataclass
class FSDPDataParallel:
    """The torch engine's parallel strategy over a torch.distributed group (module docstring): given to the
    engine at construction, which ``wrap``s the policy (and critic) before building their optimizers."""

    rank: int
    world: int
    balance: bool
    collective = True  # weights, checkpoints and exports gather on every rank
    whole_batch = False  # each rank trains its share of the rows

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module sharded with FSDP2 (in place; fully_shard_model)."""
        return fully_shard_model(module)

    # ---- optimizer steps ------------------------------------------------------------------------
    def shard(self, batch: TokenBatch, rows: range, size: int) -> tuple[list[int], int]:
        """-> (this rank's rows of the global batch ``rows``, the busiest rank's number of micro-batches of
        ``size`` rows). Every rank computes every share, so the count needs no communication."""
        lengths = batch.attention_mask.sum(-1).tolist()
        shares = split_rows(rows, lengths, self.world, self.balance)
        return shares[self.rank], -(-max(len(s) for s in shares) // size)

    def reduce_step(self, metrics: dict[str, float], pad: int, dummy: Callable[[], torch.Tensor]) -> dict[str, float]:
        """After this rank's micro-batches of one step: ``pad`` zero-weighted ``dummy()`` passes (a scalar
        through the sharded module), so it has run as many as the busiest rank, then -> the metric totals
        summed over ranks. The gradients are already summed by FSDP2's reduce-scatter."""
        import torch.distributed as dist

        for _ in range(pad):
            (dummy() * 0.0).backward()
        names = sorted(metrics)
        on_gpu = dist.get_backend() == "nccl"  # NCCL reduces GPU tensors only
        flat = torch.tensor([metrics[k] for k in names], dtype=torch.float64, device="cuda" if on_gpu else "cpu")
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        return {k: float(v) for k, v in zip(names, flat)}

    # ---- forward-only passes --------------------------------------------------------------------
    def forward_only(self, fn: Callable, batch: TokenBatch, samples: list):
        """fn(part, part_samples) -> a dataclass of [n, t] tensors (or None) over the rows of ``part``;
        run on this rank's share of all N rows, -> the same dataclass over all rows, [N, T] fields,
        equal on every rank. Shares are padded to one row count with copies of their last row (FSDP2:
        the same number of micro-batch passes on every rank); the copies are dropped."""
        shares = split_rows(range(len(batch)), batch.attention_mask.sum(-1).tolist(), self.world, self.balance)
        width = max(len(s) for s in shares)
        mine = shares[self.rank]
        padded = mine + [mine[-1] if mine else 0] * (width - len(mine))
        out = fn(batch.take(padded), [samples[i] for i in padded])
        T = batch.loss_mask.shape[1]
        gathered = {}
        for f in dataclasses.fields(out):
            part = getattr(out, f.name)
            if isinstance(part, torch.Tensor):
                gathered[f.name] = self._gather_rows(part, shares, T)
        return dataclasses.replace(out, **gathered)

    def _gather_rows(self, part: torch.Tensor, shares: list[list[int]], T: int) -> torch.Tensor:
        """part [width, t] (this rank's rows, padded) -> [N, T]: every rank's rows at their places."""
        import torch.distributed as dist

        part = torch.nn.functional.pad(part, (0, T - part.shape[1])).contiguous()  # [width, T]
        pieces = [torch.empty_like(part) for _ in range(self.world)]
        dist.all_gather(pieces, part)
        out = part.new_zeros((sum(len(s) for s in shares), T))  # [N, T]
        for rows, piece in zip(shares, pieces):
            out[rows] = piece[: len(rows)]
        return out

    # ---- full tensors ---------------------------------------------------------------------------
    def full_state(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The module's state dict with full (unsharded) tensors, on every rank; a collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))

    def full_model(self, module: torch.nn.Module) -> torch.nn.Module:
        """A plain (unsharded) copy of an HF model with the gathered weights, for export; a collective."""
        from transformers import AutoModelForCausalLM

        state = self.full_state(module)
        copy = AutoModelForCausalLM.from_config(module.config, dtype=next(iter(state.values())).dtype)
        copy.load_state_dict(state)
        return copy.eval()

    def checkpoint_parts(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """(module, optimizer) as the checkpoint code reads and loads them: full tensors (FullModule, FullOptimizer)."""
        return FullModule(module), FullOptimizer(module, optimizer)

    def gather_for_save(self, parts: list) -> None:
        """Every rank gathers the full tensors of ``parts`` (in this order: a collective); rank 0 then writes them."""
        for part in parts:
            part.state_dict()


class FullModule:
    """What the checkpoint code reads and loads of an FSDP2 module: ``state_dict()`` with full HF-named
    tensors (gathered at the first call, a collective), ``load_state_dict`` of full tensors into the
    shards, and the module's ``config``."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.config, self._state = module, getattr(module, "config", None), None

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self._state is None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            self._state = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True))
        return self._state

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        self._state = None
        return set_model_state_dict(self.module, dict(state_dict), options=StateDictOptions(full_state_dict=True, strict=strict))


class FullOptimizer:
    """An FSDP2 module's optimizer as the checkpoint code reads and loads it: ``state_dict()`` in the
    plain ``torch.optim`` form (state keyed by parameter index) with full tensors, so a checkpoint moves
    between world sizes (one process reads it as is); gathered at the first call, a collective."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.module, self.optimizer, self._state = module, optimizer, None
        # index i = the optimizer's i-th parameter: the trained ones (LoRA: the adapters), in the module's order
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]

    def state_dict(self) -> dict:
        if self._state is None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            full = get_optimizer_state_dict(self.module, self.optimizer, options=StateDictOptions(full_state_dict=True))
            index = {n: i for i, n in enumerate(self.names)}
            self._state = {"state": {index[n]: s for n, s in full["state"].items()},
                           "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]}
        return self._state

    def load_state_dict(self, state_dict: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if len(state_dict["state"]) > len(self.names):
            raise ValueError(f"the saved optimizer has state for {len(state_dict['state'])} parameters, this one {len(self.names)}")
        full = {"state": {self.names[i]: s for i, s in state_dict["state"].items()},
                "param_groups": [{**g, "params": [self.names[i] for i in g["params"]]} for g in state_dict["param_groups"]]}
        self._state = None
        set_optimizer_state_dict(self.module, self.optimizer, full, options=StateDictOptions(full_state_dict=True))
