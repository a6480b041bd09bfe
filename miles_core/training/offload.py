"""offload_train: the trained state off the training device between train stages, and back (both engines).

What moves: every storage the trainer owns on its device, found from its models (parameters, buffers, gradients,
megatron's ``main_grad``) and its optimizers (the inner torch optimizers' parameters, which are megatron's fp32
main weights, and their state: Adam moments, step counts), plus any extra tensors an engine names (megatron's DDP
grad and param buffers, of which parameters and main grads are views). Storages are deduplicated (tied
embeddings, views into one buffer move once).

How: ``offload`` copies each storage into its park (offload_train_target: cpu, host memory, pinned when the device is a
GPU; disk, a file of its own, disk.py's ``DiskPark``, written a chunk at a time) and resizes the device storage to 0
bytes, so its memory is freed while every tensor object (the parameters the optimizer keys its
state by, views, FSDP2's local shards) stays what it was; ``onload`` resizes it back and copies the bytes in.
The tensors hold the same values after the round trip (bit for bit). The reference does the same with
torch_memory_saver's pause / resume of the train process's CUDA allocations (miles/backends/megatron_utils/
actor.py sleep / wake_up) or, on its FSDP backend, ``model.cpu()`` and the optimizer state moved.

On the CPU device the move is a real copy as well: the training tensors' storages are released and their bytes
live in the host copies until ``onload`` (``where()`` reports both sides).

rematerialize_param_from_master_weight (a ``Rematerialize``, the Megatron trainer's 16-bit parameters): the storages
that hold only parameters with fp32 main weights (megatron DDP's param buffers with the distributed optimizer, each
parameter's own storage without) are freed with no host copy, and ``onload`` rebuilds them from the main weights
(which are parked and copied back first) by the cast the optimizer step ends with. With ``check`` the parameters are
copied to the host too, and compared with the rebuilt ones bit for bit (the reference's
check_rematerialize_param_from_master_weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from .disk import HostPark


def module_tensors(module) -> Iterable[torch.Tensor]:
    """A model's parameters, buffers and gradients (megatron's main_grad too); DTensors by their local shard."""
    if module is None:
        return
    for p in module.parameters():
        yield p
        for extra in (p.grad, getattr(p, "main_grad", None)):
            if extra is not None:
                yield extra
    yield from torch.nn.Module.buffers(module)  # megatron's DDP names its grad buffers ``buffers``: not these


def optimizer_tensors(optimizer) -> Iterable[torch.Tensor]:
    """An optimizer's parameters (megatron: its fp32 main weights) and state tensors; megatron's chained or mixed
    precision optimizers by their inner torch optimizers."""
    if optimizer is None:
        return
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", opt)
        for group in inner.param_groups:
            for p in group["params"]:
                yield p
                if p.grad is not None:
                    yield p.grad
        for state in inner.state.values():
            yield from (v for v in state.values() if torch.is_tensor(v))


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # an FSDP2 DTensor: its shard on this rank holds the storage
    return to_local() if callable(to_local) else t


def _rehome(storage: torch.UntypedStorage, tensors: list[torch.Tensor]) -> torch.UntypedStorage:
    """A resizable copy of ``storage``, which ``tensors`` (every one of ours viewing it) then view instead."""
    fresh = torch.empty(storage.nbytes(), dtype=torch.uint8, device=storage.device).untyped_storage()
    fresh.copy_(storage)
    with torch.no_grad():
        for t in tensors:
            t.set_(fresh, t.storage_offset(), t.size(), t.stride())
    return fresh


@dataclass(frozen=True)
class Where:
    """Where the trained state lives: bytes resident on the training device, bytes parked in host copies."""

    device_bytes: int
    host_bytes: int
    dropped_bytes: int = 0  # freed with no host copy: rebuilt from the fp32 main weights on onload (Rematerialize)
    disk_bytes: int = 0  # parked in files (offload_train_target disk)

    @property
    def offloaded(self) -> bool:
        return self.host_bytes + self.disk_bytes > 0 and self.device_bytes == 0


@dataclass(frozen=True)
class Rematerialize:
    """What rematerialize_param_from_master_weight rebuilds instead of parking: ``params()`` the (name, parameter) of
    every 16-bit parameter with fp32 main weights, ``owners()`` other tensors that view only those parameters' bytes
    (megatron DDP's param buffers), ``rebuild()`` writes the parameters from the main weights (the optimizer step's
    cast, and the distributed optimizer's all-gather); ``check`` keeps host copies of the parameters and compares."""

    params: Callable[[], Iterable[tuple[str, torch.Tensor]]]
    owners: Callable[[], Iterable[torch.Tensor]]
    rebuild: Callable[[], None]
    check: bool = False


class RematerializeMismatch(RuntimeError):
    """check_rematerialize_param_from_master_weight: a rebuilt parameter differs from its value at offload."""


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t's bytes as integers, so that equality is bitwise (NaN, -0.0)."""
    return t.detach().contiguous().view(-1).view(torch.uint8)


class Offloader:
    """Parks the storages of ``tensors()`` (a callable: the set is read at each offload, since gradients and
    optimizer state appear after the first step) in ``park`` (disk.py: HostPark, the default, or DiskPark; see
    disk.park_of), and restores them; with ``remat`` the storages of its parameters are freed without a copy and
    rebuilt on onload (see the module docstring)."""

    def __init__(self, tensors, device: torch.device, park=None, remat: Rematerialize | None = None):
        self.tensors, self.device, self.remat = tensors, device, remat
        self.park = park if park is not None else HostPark(device.type == "cuda")
        self.parked: list[tuple[torch.UntypedStorage, object]] = []  # (device storage, its park's handle)
        self.dropped: list[tuple[torch.UntypedStorage, int]] = []  # (device storage, its size): rebuilt by remat
        self.backup: dict[str, torch.Tensor] = {}  # remat.check: each rebuilt parameter's value at offload

    @property
    def offloaded(self) -> bool:
        return bool(self.parked or self.dropped)

    def _grouped(self) -> list[tuple[torch.UntypedStorage, list[torch.Tensor]]]:
        """The distinct non-empty storages of ``tensors()`` with the tensors viewing each; one that cannot be resized (a
        tensor loaded from a mapped safetensors file) is first copied into one that can, and its tensors re-pointed at
        it (same values, views)."""
        by_key: dict[tuple, tuple[torch.UntypedStorage, list[torch.Tensor]]] = {}
        for t in map(_local, self.tensors()):
            s = t.untyped_storage()
            if s.nbytes():
                by_key.setdefault((s.device, s.data_ptr()), (s, []))[1].append(t)
        out = []
        for s, tensors in by_key.values():
            if not s.resizable():
                s = _rehome(s, tensors)
            out.append((s, tensors))
        return out

    def _storages(self) -> list[torch.UntypedStorage]:
        return [s for s, _ in self._grouped()]

    def offload(self) -> None:
        """Every storage copied to the host (or, with remat, dropped), then its device memory freed (a no-op when
        already offloaded)."""
        if self.offloaded:
            return
        pin = self.device.type == "cuda"
        rebuilt: set[int] = set()
        if self.remat is not None:
            named = list(self.remat.params())
            rebuilt = {id(p) for _, p in named} | {id(t) for t in self.remat.owners()}
            if self.remat.check:
                for name, p in named:
                    self.backup[name] = torch.empty_like(p, device="cpu", pin_memory=pin).copy_(p.detach())
        for s, tensors in self._grouped():
            if rebuilt and all(id(t) in rebuilt for t in tensors):  # every byte a tensor reads is rebuilt on onload
                self.dropped.append((s, s.nbytes()))
                continue
            self.parked.append((s, self.park.put(len(self.parked), s)))
        self.park.done()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        for s, _ in self.parked + self.dropped:
            s.resize_(0)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Every parked storage back to its size on the device and its bytes copied in; with remat the dropped ones
        reallocated (zeroed) and the parameters rebuilt from the main weights, then checked with ``check`` (a no-op
        when resident)."""
        for s, handle in self.parked:
            s.resize_(self.park.host_bytes(handle) + self.park.disk_bytes(handle))
            self.park.take(handle, s)
        self.park.done()
        for s, nbytes in self.dropped:
            s.resize_(nbytes)
            s.fill_(0)
        self.parked = []
        if self.dropped:
            self.dropped = []
            self.remat.rebuild()
        backup, self.backup = self.backup, {}
        if backup:
            self._check(backup)

    def _check(self, backup: dict[str, torch.Tensor]) -> None:
        """check_rematerialize_param_from_master_weight: the rebuilt parameters equal their values at offload, bit for
        bit; else the first that differs is named."""
        for name, p in self.remat.params():
            before = backup[name]
            if not torch.equal(_bits(p.detach().cpu()), _bits(before)):
                differ = int((p.detach().cpu() != before).sum())
                raise RematerializeMismatch(
                    f"check_rematerialize_param_from_master_weight: parameter {name} rebuilt from its fp32 main weights "
                    f"differs from its value at offload ({differ} of {p.numel()} elements): the main weights no longer "
                    "cast to the 16-bit weights the model had")

    def where(self) -> Where:
        """The bytes of the trained state on the device now, in host copies, in files and dropped to be rebuilt."""
        return Where(device_bytes=sum(s.nbytes() for s in self._storages()),
                     host_bytes=sum(self.park.host_bytes(h) for _, h in self.parked)
                     + sum(t.numel() * t.element_size() for t in self.backup.values()),
                     dropped_bytes=sum(n for _, n in self.dropped),
                     disk_bytes=sum(self.park.disk_bytes(h) for _, h in self.parked))
