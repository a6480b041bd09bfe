"""Weight sync trainer -> engines in buckets of at most ``update_weight_buffer_size`` bytes.

Sequence (REFERENCE §6): pause generation -> flush cache -> buckets -> set weight version -> continue.
A single tensor larger than the bucket size travels alone.
"""

from __future__ import annotations

import time
from typing import Iterable, Iterator

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
    """Push weights into every engine (tensor mode, same process). -> perf metrics."""
    t0 = time.perf_counter()
    for e in engines:
        e.pause_generation()
        e.flush_cache()
    n_buckets = 0
    for bucket in iter_buckets(named_tensors, max_bytes):
        for e in engines:
            e.update_weights_from_tensor(bucket)
        n_buckets += 1
    for e in engines:
        e.set_weight_version(version)
        e.continue_generation()
    return {"perf/update_weights_time": time.perf_counter() - t0}
