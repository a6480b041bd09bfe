"""Cluster and runtime placement arguments."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Group


class ClusterConfig(Group):
    """Where the work runs (one process or a Ray cluster), the trainer backend and rollout engine, GPU placement, weight sync and fault tolerance."""

    runtime: Literal["local", "ray"] = Field("local", description="Where the work runs: one process (local) or a Ray cluster (ray).")
    ray_address: str | None = Field(None, description="Ray cluster address (ray://host:port); None starts a local Ray.")
    train_backend: Literal["torch", "megatron"] = Field("torch", description="Trainer backend.")
    rollout_engine: Literal["hf", "sglang"] = Field("hf", description="Rollout engine: in-process transformers (hf) or SGLang servers.")
    actor_num_nodes: int = Field(1, ge=1, description="Number of nodes for the training actors.")
    actor_num_gpus_per_node: int = Field(1, ge=1, description="Training actors per node (GPUs, or CPU bundles when there is no GPU).")
    rollout_num_gpus: int | None = Field(None, ge=1, description="Total GPUs for rollout engines; defaults to the actor total when colocated.")
    rollout_num_gpus_per_engine: int = Field(1, ge=1, description="GPUs per rollout engine (tensor parallel size).")
    colocate: bool = Field(False, description="Share devices between training and rollout, offloading between phases.")
    device: Literal["cpu", "cuda", "auto"] = Field("cpu", description="Where models train and generate: cpu, cuda (fails at run "
        "start without a CUDA device), auto (cuda when present, else cpu). On Ray, cuda (or auto on a cluster with GPUs) reserves "
        "a GPU per bundle and each actor uses its own. Refused on a GPU yet: train_backend megatron (docs/gpu.md).")
    offload: bool = Field(
        False, description="offload_train and offload_rollout together (the reference's --offload): both default to on; an "
        "explicit false for either contradicts it and is refused.")
    offload_rollout: bool | None = Field(
        None, description="Release the rollout engines' memory (the offload_rollout_level kinds, and CUDA graphs) for each train "
        "stage and resume it at the next weight sync (SGLang's /release_memory_occupation, /resume_memory_occupation). "
        "None: when colocated (or with offload). Engines that generate during training (async_mode) or run in this process (runtime local) "
        "cannot release it.")
    offload_rollout_level: list[Literal["kv_cache", "weight"]] = Field(
        ["kv_cache", "weight"], min_length=1, description="What offload_rollout releases besides CUDA graphs: kv_cache, weight "
        "(SGLang's memory tags kv_cache and weights).")
    balance_data: bool = Field(False, description="Ray runtime: split each global batch over the train ranks by token count (else in contiguous blocks).")
    update_weight_buffer_size: int = Field(512 * 1024**2, ge=1, description="Bytes per weight-sync bucket.")
    update_weight_mode: Literal["tensor", "broadcast", "disk"] | None = Field(
        None, description="Ray runtime weight sync: tensor (buckets over HTTP), broadcast (a gloo/NCCL group from train rank 0 "
        "to the engines, metadata over HTTP), disk (an HF dir under <run_dir>/weight_sync, engines reload it). "
        "None: tensor when colocated (disk with rollout_engine sglang), broadcast when disaggregated. The local runtime "
        "copies in process (tensor), unless update_weight_transfer_mode is disk-delta.")
    update_weight_transfer_mode: Literal["broadcast", "p2p", "disk-delta"] = Field(
        "broadcast", description="How weights reach engines that are not colocated when update_weight_mode is unset: "
        "broadcast (a process group from train rank 0 to the engines, metadata over HTTP: the reference's default); "
        "disk-delta (each sync after the first publishes only the changed bytes against the previous sync under "
        "update_weight_disk_dir; each engine verifies and applies them into update_weight_local_checkpoint_dir with "
        "/pull_weights and reloads from it: our engines, in process or over HTTP; refused with rollout_engine sglang, "
        "whose 0.5.23 has no /pull_weights). p2p (Mooncake transfers) is refused: see the compat page.")
    update_weight_disk_dir: str | None = Field(
        None, description="disk-delta: the directory the trainer publishes to, one weight_v<NNNNNN> dir per sync (the "
        "first of a process a full HF checkpoint, later ones the changed tensors only), read by every engine. "
        "Required with update_weight_transfer_mode disk-delta.")
    update_weight_local_checkpoint_dir: str | None = Field(
        None, description="disk-delta: the engines' local full HF checkpoint, kept in step by /pull_weights (seeded from "
        "a full version, deltas patched in after their checksums pass); the engines reload from it. Required with "
        "disk-delta; not inside update_weight_disk_dir (nor containing it).")
    update_weight_delta_encoding: Literal["xor", "overwrite"] = Field(
        "xor", description="disk-delta encoding, byte-level and dtype-blind: xor (new ^ old: smallest, applied exactly "
        "once on its base version) or overwrite (changed positions and their new bytes: larger, idempotent). Both are "
        "exact; zstd-compressed (level 1).")
    update_weight_delta_checksum: Literal["xxh3-128", "blake3", "adler32"] = Field(
        "xxh3-128", description="disk-delta: the per-tensor checksum of each tensor's new bytes, verified by the engine "
        "before it writes any: xxh3-128 or adler32 (blake3 is refused: its package is not among miles' dependencies).")
    custom_update_weight_post_write_path: str | None = Field(
        None, description="disk-delta: a function called after each version's files are written, before the engines read "
        "them (e.g. to publish them on a filesystem without cross-host read-after-write): "
        "hook(args, version_dir, rollout_engines), the reference's signature; called by the process that drives the "
        "sync (the driver, or the local runtime's process).")
    use_fault_tolerance: bool = Field(False, description="Ray runtime: a health monitor polls every engine and restarts dead ones (see ft_components).")
    ft_components: list[Literal["rollout"]] = Field(["rollout"], description="What the fault tolerance covers: rollout (engine servers).")
    rollout_health_check_interval: float = Field(30.0, gt=0, description="Seconds between two health checks of the engines (use_fault_tolerance).")
    rollout_health_check_first_wait: float = Field(
        0, ge=0, description="Seconds from the engines' start to the first health check (use_fault_tolerance; engines "
                             "compiling kernels at start may need minutes), then one every rollout_health_check_interval.")
    rollout_health_check_timeout: float = Field(30.0, gt=0, description="An engine whose /health_generate does not answer 200 within this many seconds is dead: killed and restarted.")
    train_env_vars: dict[str, str] = Field(
        default_factory=dict, description="Ray runtime: extra environment variables of the training processes (every train "
        "rank's actor, e.g. PyTorch memory settings), over those it inherits. The local runtime trains in this process: "
        "set them in its environment instead (refused there).")
    mfu_peak_tflops: float | None = Field(None, gt=0, description="Peak TFLOP/s of one training device, for perf/actor_train_mfu (unset: no MFU).")
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads for the local runtime (None = torch default).")
    torch_compile: bool = Field(
        False, description="train_backend torch: compile the policy's decoder layers with torch.compile (inductor, dynamic "
        "shapes) at the first training step; one compiled graph serves every layer. The first step pays the compile "
        "(~30 s on 2 CPU cores for the tiny model; kernels are cached under .cache/torchinductor), later training "
        "steps of a small model run up to ~20% faster on CPU (a matmul-bound one, e.g. SmolLM2-135M, gains nothing): "
        "for long runs of small models (docs/guide/backends.md).")

    @property
    def rollout_offload_tags(self) -> list[str]:
        """SGLang's memory tags the engines release for a train stage (the reference's train.py: cuda_graph, then kv_cache
        and weights by offload_rollout_level); [] when offload_rollout is off (its default: colocate or offload)."""
        if not ((self.colocate or self.offload) if self.offload_rollout is None else self.offload_rollout):
            return []
        level = self.offload_rollout_level
        return ["cuda_graph"] + ["kv_cache"] * ("kv_cache" in level) + ["weights"] * ("weight" in level)

    @property
    def weight_sync_mode(self) -> str:
        """update_weight_mode, or its default: tensor when colocated (or local), update_weight_transfer_mode (broadcast) when
        disaggregated, disk-delta whenever it is asked and not colocated (the local runtime too); colocated
        SGLang engines: disk (SGLang's tensor route takes CUDA-IPC handles, which miles does not build: docs/engines.md)."""
        if self.update_weight_mode is not None:
            return self.update_weight_mode
        if self.colocate and self.rollout_engine == "sglang":
            return "disk"
        if self.update_weight_transfer_mode == "disk-delta" and not self.colocate:
            return "disk-delta"  # also the local runtime's in-process engine (applies the deltas as a server would)
        return "tensor" if self.colocate or self.runtime == "local" else self.update_weight_transfer_mode
