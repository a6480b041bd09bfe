"""Process groups for the Megatron trainer: torch.distributed + megatron's parallel_state.

On the Ray runtime each train-group actor has called ``torch.distributed.init_process_group`` (gloo on
CPU, NCCL on GPU) before building the trainer; in the local runtime there is none, and ``init_parallel``
starts a one-process gloo group on a free 127.0.0.1 port itself (and ``teardown`` ends it again).
megatron's model-parallel groups (TP, PP, CP, EP, DP) are then cut from the world
(``parallel_state.initialize_model_parallel``, their collectives timing out after ``distributed_timeout_minutes``),
world = TP * PP * CP * DP, and the RNG tracker seeded (on the
device: megatron's model_parallel_cuda_manual_seed seeds the CUDA generators on a GPU, cpu.py redirects them to the
CPU generator on a machine without CUDA). A one-rank world of its own is NCCL on a GPU, gloo on the CPU.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from miles_core.config.parallel import ParallelConfig

_OWN_WORLD = False  # whether init_parallel started the default process group (then teardown ends it)


def init_parallel(p: ParallelConfig, seed: int, device: str) -> None:
    """Model-parallel groups of sizes ``p`` over the current world (a one-rank gloo world if none)."""
    global _OWN_WORLD
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from .cpu import install

    install(device)
    if device == "cuda":
        torch.cuda.set_device(torch.cuda.current_device())  # the actor's own GPU (Ray sets CUDA_VISIBLE_DEVICES)
    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        # a one-rank world needs no rendezvous: an in-process store (a free port probed, closed and bound later
        # could be taken in between on a busy machine)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(minutes=p.distributed_timeout_minutes))
        _OWN_WORLD = True
    world = dist.get_world_size()
    if world % p.model_parallel:
        raise ValueError(f"world size {world} is not a multiple of tensor_model_parallel_size * pipeline_model_parallel_size "
                         f"* context_parallel_size = {p.model_parallel}")
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                ps.get_expert_model_parallel_world_size())
        want = (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.expert_model_parallel_size)
        if have != want:
            raise RuntimeError(f"megatron parallel state already initialised with (TP, PP, EP) = {have}, not {want}; "
                               "call miles_core.training.megatron.parallel.teardown() first")
    else:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=p.tensor_model_parallel_size, pipeline_model_parallel_size=p.pipeline_model_parallel_size,
            context_parallel_size=p.context_parallel_size, expert_model_parallel_size=p.expert_model_parallel_size,
            expert_tensor_parallel_size=p.expert_tp, distributed_timeout_minutes=p.distributed_timeout_minutes,
        )
    tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
    torch.manual_seed(seed)


def teardown() -> None:
    """Destroy megatron's groups (and the default group if init_parallel started it)."""
    global _OWN_WORLD
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    if _OWN_WORLD and dist.is_initialized():
        dist.destroy_process_group()
    _OWN_WORLD = False


def my_rows(rows: range) -> list[int]:
    """This data-parallel rank's contiguous block of a step's rows."""
    from megatron.core import parallel_state as ps

    dp, rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    per = -(-len(rows) // dp)
    return list(rows)[rank * per : (rank + 1) * per]


def sum_over_data_parallel(totals: dict[str, float]) -> dict[str, float]:
    """Metric totals summed over the data-parallel ranks."""
    from megatron.core import parallel_state as ps

    if not totals or ps.get_data_parallel_world_size() == 1:
        return totals
    names = sorted(totals)
    t = torch.tensor([totals[n] for n in names], dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, group=ps.get_data_parallel_group())
    return dict(zip(names, t.tolist()))


def comm_device() -> torch.device:
    """Where a tensor for a collective must be: the current GPU under NCCL, else the CPU (gloo)."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def from_last_stage(obj):
    """obj as the last pipeline stage has it, on every rank of the pipeline group."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return obj
    box = [obj]
    src = ps.get_pipeline_model_parallel_last_rank()
    dist.broadcast_object_list(box, src=src, group=ps.get_pipeline_model_parallel_group())
    return box[0]
