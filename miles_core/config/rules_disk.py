"""The rules of the disk offload fields: offload_train_target disk, stream_optimizer_state_to_disk, their dir, chunk
and moment dtype (the reference's miles/utils/arguments.py 3339-3398, and 2823-2826 for rematerialize).

Pure, as rules.py: they read the config's own values only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .train import TrainConfig

STREAM = "stream_optimizer_state_to_disk"


def disk_offload_rules(c: "TrainConfig") -> None:
    p = c.parallel
    disk = p.offload_train_target == "disk"
    if disk and not c.offloads_trainer:
        raise ValueError("offload_train_target disk is where offload_train parks the trainer's state, but offload_train "
                         "is off: set offload_train: true (or colocate: true), or drop offload_train_target")
    if disk and p.rematerialize_param_from_master_weight:
        raise ValueError("rematerialize_param_from_master_weight with offload_train_target disk is not supported (as in "
                         "the reference: the parameters it rebuilds have no parked copy to replace); use "
                         "offload_train_target: cpu, or drop rematerialize_param_from_master_weight")
    _unused_fields(c, disk)
    if p.stream_optimizer_state_to_disk:
        _stream_rules(c)
    if disk or p.stream_optimizer_state_to_disk:
        _apart_from_checkpoints(c)


def _unused_fields(c: "TrainConfig", disk: bool) -> None:
    """The dir and the chunk size apply only with a disk use, the moment dtype only with streaming: never accepted and
    ignored."""
    p = c.parallel
    fields = type(p).model_fields
    uses = {"offload_train_disk_dir": disk or p.stream_optimizer_state_to_disk,
            "offload_train_disk_chunk_mb": disk or p.stream_optimizer_state_to_disk,
            "stream_optimizer_state_moment_dtype": p.stream_optimizer_state_to_disk}
    for name, used in uses.items():
        value = getattr(p, name)
        if not used and value != fields[name].default:
            needs = STREAM if name.startswith("stream") else f"offload_train_target disk or {STREAM}"
            raise ValueError(f"{name} {value!r} applies only with {needs}, which is off: set it, or drop {name}")


def _stream_rules(c: "TrainConfig") -> None:
    """stream_optimizer_state_to_disk: the torch trainer's AdamW on one train rank; what the reference refuses with it."""
    p, cl = c.parallel, c.cluster
    if cl.train_backend == "megatron":
        raise ValueError(f"{STREAM} is not supported yet with train_backend megatron: megatron-core's optimizer keeps "
                         "its fp32 main weights and moments inside its own (distributed) optimizer, whose buffers this "
                         "streaming does not bind (the reference patches its DistributedOptimizer); use train_backend "
                         f"torch, or drop {STREAM}")
    if c.offloads_trainer and p.offload_train_target != "disk":
        raise ValueError(f"{STREAM} with offload_train requires offload_train_target disk (as in the reference: a run "
                         "whose optimizer state does not fit the device during the step cannot hold a host copy of the "
                         f"whole trainer either): set offload_train_target: disk, or drop {STREAM}")
    world = cl.actor_num_nodes * cl.actor_num_gpus_per_node if cl.runtime == "ray" else 1
    if world > 1:
        raise ValueError(f"{STREAM} is not supported yet with data parallel (world size {world}): FSDP's sharded "
                         f"optimizer state is not streamed; use one train rank, or drop {STREAM}")
    for name, on, why in (
            ("lora_rank > 0", c.lora.lora_rank > 0, "as in the reference"),
            ("reset_optimizer_states", c.algo.reset_optimizer_states,
             "as in the reference: the reset walks the optimizer's state, which the disk files hold")):
        if on:
            raise ValueError(f"{STREAM} with {name} is not supported ({why}); drop one of them")


def _apart_from_checkpoints(c: "TrainConfig") -> None:
    """The disk dir is emptied and rewritten (parking is not a checkpoint): never a checkpoint dir, nor inside or
    around one."""
    root = c.offload_disk_dir.resolve()
    for name, d in (("save", c.save_dir), ("load", c.load_dir)):
        d = Path(d).resolve()
        if root == d or root in d.parents or d in root.parents:
            raise ValueError(f"offload_train_disk_dir {root} overlaps the checkpoint {name} dir {d}: its files are "
                             "removed and rewritten as the trainer parks (it is not a checkpoint); use a directory of "
                             "its own (None: <run_dir>/train_offload)")
