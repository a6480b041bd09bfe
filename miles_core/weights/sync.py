"""Weight sync trainer -> engines in buckets of at most ``update_weight_buffer_size`` bytes.

Sequence (REFERENCE §6): pause generation -> flush cache -> buckets -> set weight version -> continue.
A single tensor larger than the bucket size travels alone.

    sync_weights   the local runtime: tensors copied into an in-process engine
    WeightSync     the Ray runtime: modes tensor / broadcast / disk into engine servers (docs/ray.md)
    WeightSender   the trainer side of WeightSync (train rank 0)
"""

from __future__ import annotations

import math
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]]


def iter_buckets(named_tensors: NamedTensors, max_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


def sync_weights(named_tensors: NamedTensors, engines: list, version: int, max_bytes: int) -> dict[str, float]:
    """Push weights into every engine (tensor mode, same process). -> perf metrics. A failure leaves the
    engines generating again at the version they had (the caller does not bump its own)."""
    t0 = time.perf_counter()
    for e in engines:
        e.pause_generation()
    try:
        for e in engines:
            e.flush_cache()
        for bucket in iter_buckets(named_tensors, max_bytes):
            for e in engines:
                e.update_weights_from_tensor(bucket)
        for e in engines:
            e.set_weight_version(version)
    finally:
        for e in engines:
            e.continue_generation()
    return {"perf/update_weights_time": time.perf_counter() - t0}


# ---- modes: trainer -> engine servers (the Ray runtime) ------------------------------------------------
MODES = ("tensor", "broadcast", "disk")


def _dtype_size(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def iter_meta_buckets(names: list[str], dtypes: list[str], shapes: list[list[int]], max_bytes: int) -> Iterator[range]:
    """Index ranges of buckets of at most ``max_bytes`` over tensor metadata (as iter_buckets does on tensors)."""
    start, size = 0, 0
    for i, (dtype, shape) in enumerate(zip(dtypes, shapes)):
        nbytes = math.prod(shape) * _dtype_size(dtype)
        if i > start and size + nbytes > max_bytes:
            yield range(start, i)
            start, size = i, 0
        size += nbytes
    if start < len(names):
        yield range(start, len(names))


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``t`` on the CPU (a copy also when it already is there)."""
    return t.detach().to("cpu", copy=True)


class WeightSender:
    """The trainer's side of a sync (train rank 0, or the model in process for tests).

    ``named_tensors()`` -> HF-format (name, tensor) of the current weights; ``hf_config`` is written
    next to the weights in disk mode (a real SGLang needs config.json to reload)."""

    def __init__(self, named_tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]], hf_config=None):
        self._named, self.hf_config = named_tensors, hf_config
        self.group, self.device = None, "cpu"

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """CPU copies (they travel to the driver through Ray's object store, which may see no GPU)."""
        return [(k, host_copy(v)) for k, v in self._named()]

    def meta(self) -> tuple[list[str], list[str], list[list[int]]]:
        from .broadcast import tensor_meta

        return tensor_meta(list(self._named()))

    def master_address(self) -> tuple[str, int]:
        """(this host's address, a free port) for a new broadcast group hosted here."""
        from .broadcast import free_port

        host = socket.gethostbyname(socket.gethostname())
        return host, free_port(host)

    def init_broadcast(self, host: str, port: int, world_size: int, backend: str) -> None:
        """Join the group as rank 0 (blocks until the engines joined)."""
        from .broadcast import new_group

        self.group = None  # drop the previous group first
        self.group = new_group(host, port, 0, world_size, backend)
        self.device = "cuda" if backend == "nccl" else "cpu"

    def broadcast(self, names: list[str]) -> None:
        from .broadcast import send

        named = dict(self._named())
        send(self.group, [named[n] for n in names], self.device)

    def save(self, path: str) -> str:
        from .disk import save_hf_weights

        return str(save_hf_weights(list(self._named()), path, self.hf_config))


class WeightSync:
    """One run's weight sync, driver side: pause -> flush -> buckets (by ``mode``) -> set version -> continue.

    tensor     the driver fetches the sender's tensors and POSTs safetensors buckets (/update_weights_from_tensor)
    broadcast  a process group sender + engines (created on the first sync, again when the engine set
               changed); per bucket /update_weights_from_distributed carries names/dtypes/shapes while
               the sender broadcasts the bytes
    disk       the sender saves <disk_dir>/v<version> atomically; engines /update_weights_from_disk
    ``router`` is an EngineRouter (the engines); ``sender`` a WeightSender or a proxy with its methods.
    """

    def __init__(self, mode: str, bucket_bytes: int, disk_dir: str | Path | None = None, backend: str = "gloo"):
        if mode not in MODES:
            raise ValueError(f"weight sync mode {mode!r}: expected one of {MODES}")
        if mode == "disk" and disk_dir is None:
            raise ValueError("weight sync mode disk needs a directory (disk_dir)")
        self.mode, self.bucket_bytes, self.backend = mode, bucket_bytes, backend
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self._group_key: tuple[str, ...] | None = None
        self._groups = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="miles-weight-sync")

    def sync(self, sender, router, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        router.pause_generation()
        try:
            router.flush_cache()
            getattr(self, f"_push_{self.mode}")(sender, router, version)
            router.set_weight_version(version)
        finally:  # a failed sync leaves the engines generating again, at the version they had
            router.continue_generation()
        return {"perf/update_weights_time": time.perf_counter() - t0}

    def _push_tensor(self, sender, router, version: int) -> None:
        for bucket in iter_buckets(sender.tensors(), self.bucket_bytes):
            router.update_weights_from_tensor(bucket)

    def _push_disk(self, sender, router, version: int) -> None:
        path = sender.save(str(self.disk_dir / f"v{version}"))
        router.update_weights_from_disk(path, version)
        for old in self.disk_dir.glob("v*"):  # keep the version the engines serve (a restarted engine reloads it)
            if old.name != f"v{version}":
                shutil.rmtree(old, ignore_errors=True)

    def _push_broadcast(self, sender, router, version: int) -> None:
        slots = router.weight_targets()
        key = tuple(s.url for s in slots)
        if key != self._group_key:
            self._groups += 1
            self._group_name = f"miles-weights-{self._groups}"
            host, port = sender.master_address()
            self._together(lambda: router.init_weights_update_group(slots, host, port, self._group_name, self.backend),
                           lambda: sender.init_broadcast(host, port, len(slots) + 1, self.backend))
            self._group_key = key
        names, dtypes, shapes = sender.meta()
        for idx in iter_meta_buckets(names, dtypes, shapes, self.bucket_bytes):
            b_names, b_dtypes, b_shapes = [names[i] for i in idx], [dtypes[i] for i in idx], [shapes[i] for i in idx]
            try:
                self._together(lambda: router.update_weights_from_distributed(slots, b_names, b_dtypes, b_shapes, self._group_name),
                               lambda: sender.broadcast(b_names))
            except Exception:
                self._group_key = None  # a failed collective leaves the group unusable: a new one next time
                raise

    def _together(self, engines_side: Callable[[], object], sender_side: Callable[[], object]) -> None:
        """Run the engines' HTTP calls (in a thread) and the sender's collective (here) at the same time."""
        future = self._pool.submit(engines_side)
        try:
            sender_side()
        finally:
            future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=False)
