"""Weight broadcast over a torch.distributed process group: trainer rank 0 -> engines, as SGLang 0.5.23 forms it.

SGLang's receiving side (``model_runner_components/weight_updater.py::init_weights_update_group``, ~100-144)
joins with ``rank = rank_offset + tp_rank`` through ``utils/common.py::init_custom_process_group`` (~2859-2927):
a TCP rendezvous at ``tcp://master_address:master_port`` (rank 0 hosts the store), the store wrapped in
``PrefixStore(group_name, store)``, then torch's ``_new_process_group_helper`` (which adds its own
``"<group_name>/"`` and ``"<device>/"`` prefixes). A group built on the raw store (what this module did before)
never meets SGLang's keys: both sides block at set-up. ``init_custom_process_group`` here is the same function
(as the reference's ``slime/utils/distributed_utils.py::init_process_group`` copies it); the sender uses it, and
tests/weights/test_sglang_rules.py forms a group between it and SGLang's own, read from the pinned wheel.

Ranks: the sender (train rank 0) is 0; engine j's TP ranks are ``rank_offset_j + tp_rank`` with
``rank_offset_j = 1 + sum of the TP sizes of the engines before it``, world ``1 + sum of all TP sizes``
(EngineRouter.group_ranks). Per bucket, POST /update_weights_from_distributed {names, dtypes, shapes,
group_name} on every engine while the sender broadcasts the bucket's tensors one by one in that order;
every rank of every engine receives them (SGLang: ``torch.distributed.broadcast(weight, src=0, group)``).

``member_group`` is for our CPU stand-in server only: one process holding several TP ranks cannot call
``_new_process_group_helper`` once per rank (torch registers a group name once per process), so it builds
each rank's gloo group on the same store keys by hand.
"""

from __future__ import annotations

from datetime import timedelta

import torch

DEFAULT_TIMEOUT_S = 300.0
BACKENDS = ("gloo", "nccl")


def tcp_address(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"weight broadcast backend {backend!r}: expected one of {BACKENDS}")


def master_store(host: str, timeout_s: float = DEFAULT_TIMEOUT_S):
    """Rank 0's TCPStore, listening on a port the OS picked (``store.port``) before anyone is told the address.
    What ``rendezvous("tcp://host:port")`` makes for rank 0, without probing a free port first: a port found free,
    closed and bound later can be taken in between (another socket draws from the same ephemeral range)."""
    from torch.distributed import TCPStore

    return TCPStore(host, 0, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                    multi_tenant=True)


def init_custom_process_group(backend: str, init_method: str | None, world_size: int, rank: int, group_name: str,
                              timeout_s: float = DEFAULT_TIMEOUT_S, store=None):
    """SGLang's ``init_custom_process_group``: rendezvous at ``init_method`` (or rank 0's ``store`` from master_store,
    already listening), PrefixStore(group_name), torch's helper. Blocks until every rank joined.
    -> the process group (usable with torch.distributed.broadcast(group=...))."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    _check_backend(backend)
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                      backend_options=None, timeout=timeout, device_id=None)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def member_group(init_method: str, world_size: int, rank: int, group_name: str, timeout_s: float = DEFAULT_TIMEOUT_S):
    """One gloo rank on the keys init_custom_process_group uses (PrefixStore(group_name) -> "<group_name>/" ->
    "cpu/"), without registering the group in this process (the stand-in holds several TP ranks)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import PrefixStore, rendezvous

    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    keys = PrefixStore("cpu/", PrefixStore(f"{group_name}/", PrefixStore(group_name, store)))
    return dist.ProcessGroupGloo(keys, rank, world_size, timeout)


def destroy_group(group) -> None:
    """Drop a group made by init_custom_process_group (a new one may then reuse its name)."""
    import torch.distributed as dist

    if group is not None:
        dist.destroy_process_group(group)


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
