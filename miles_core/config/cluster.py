"""Cluster and runtime placement arguments."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Group


class ClusterConfig(Group):
    runtime: Literal["local", "ray"] = Field("local", description="Where the work runs: one process (local) or a Ray cluster (ray).")
    ray_address: str | None = Field(None, description="Ray cluster address (ray://host:port); None starts a local Ray.")
    train_backend: Literal["torch", "megatron"] = Field("torch", description="Trainer backend.")
    rollout_engine: Literal["hf", "sglang"] = Field("hf", description="Rollout engine: in-process transformers (hf) or SGLang servers.")
    actor_num_nodes: int = Field(1, ge=1, description="Number of nodes for the training actors.")
    actor_num_gpus_per_node: int = Field(1, ge=1, description="Training actors per node (GPUs, or CPU bundles when there is no GPU).")
    rollout_num_gpus: int | None = Field(None, ge=1, description="Total GPUs for rollout engines; defaults to the actor total when colocated.")
    rollout_num_gpus_per_engine: int = Field(1, ge=1, description="GPUs per rollout engine (tensor parallel size).")
    colocate: bool = Field(False, description="Share devices between training and rollout, offloading between phases.")
    device: Literal["cpu", "cuda", "auto"] = Field("cpu", description="Device for the local runtime.")
    balance_data: bool = Field(False, description="Ray runtime: split each global batch over the train ranks by token count (else in contiguous blocks).")
    update_weight_buffer_size: int = Field(512 * 1024**2, ge=1, description="Bytes per weight-sync bucket.")
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads for the local runtime (None = torch default).")
