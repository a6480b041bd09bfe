"""Weight broadcast over a torch.distributed process group: trainer rank 0 -> engines.

The group is its own (a TCPStore and a ProcessGroupGloo / ProcessGroupNCCL built directly, not the
default group), so a trainer that already is in a data-parallel default group can join it too.
Ranks: the sender (train rank 0) is 0, engine j (in the order of the router's healthy engines) is
``rank_offset = 1 + j``; the sender hosts the store. SGLang's protocol: POST
/init_weights_update_group {master_address, master_port, rank_offset, world_size, group_name,
backend} on every engine while the sender joins; then per bucket POST
/update_weights_from_distributed {names, dtypes, shapes, group_name} while the sender broadcasts
the bucket's tensors one by one in that order (the HTTP call carries the metadata, the bytes go
over the group).
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch

DEFAULT_TIMEOUT_S = 300.0


def free_port(host: str = "") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def new_group(host: str, port: int, rank: int, world_size: int, backend: str = "gloo",
              timeout_s: float = DEFAULT_TIMEOUT_S):
    """Join (rank 0: host) a group of ``world_size``; blocks until every rank joined. -> the group."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, world_size)
    raise ValueError(f"weight broadcast backend {backend!r}: expected gloo or nccl")


def tensor_meta(named: list[tuple[str, torch.Tensor]]) -> tuple[list[str], list[str], list[list[int]]]:
    """-> (names, dtypes like "float32", shapes): the body of /update_weights_from_distributed."""
    return ([n for n, _ in named], [str(t.dtype).removeprefix("torch.") for _, t in named], [list(t.shape) for _, t in named])


def send(group, tensors: list[torch.Tensor], device: str = "cpu") -> None:
    """Rank 0: broadcast each tensor in order."""
    for t in tensors:
        group.broadcast(t.detach().to(device).contiguous(), 0).wait()


def receive(group, names: list[str], dtypes: list[str], shapes: list[list[int]], device: str = "cpu") -> list[tuple[str, torch.Tensor]]:
    """Engine ranks: receive the tensors rank 0 broadcasts, in order."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError(f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes")
    out = []
    for name, dtype, shape in zip(names, dtypes, shapes):
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        group.broadcast(t, 0).wait()
        out.append((name, t))
    return out
