"""The trainer's state in files, moved a chunk at a time: offload_train_target disk (``DiskPark``, the storages
offload_train parks) and stream_optimizer_state_to_disk (disk_adam.py, Adam's moments between steps) share it.

Layout: <offload_train_disk_dir, default <run_dir>/train_offload>/<what>/rank<r>[/<name>], one subtree per process
(rank: torch.distributed's, 0 without a process group), emptied when it is claimed (a crashed run's leftovers) and
never shared with a checkpoint (a load-time rule keeps the dir apart from save and load). Bytes go to and from the
files through one staging buffer of offload_train_disk_chunk_mb MiB in host memory (pinned for a GPU), so the host
holds one chunk whatever is moved, and the buffer is dropped after each move. The reference's counterparts:
torch_memory_saver's disk backend (TMS_DISK_BACKUP_DIR / TMS_DISK_BACKUP_CHUNK_MB, miles/ray/train/actor_factory.py
51-58, 92-94) and its streamed Adam's stager (miles_plugins/optimizers/nvme_stream.py 107-149).

A parked file is written as <name>.part and renamed when complete (os.replace), so a crash leaves either no file
or a whole one; parking is not a checkpoint, and nothing here writes where checkpoints live.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

# stream_optimizer_state_moment_dtype: the on-disk dtype of the streamed moments (the reference's choices)
MOMENT_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                                         "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}


def process_dir(root: Path, what: str, name: str | None = None) -> Path:
    """<root>/<what>/rank<r>[/<name>]: this process's own subtree, emptied and created."""
    dist = torch.distributed
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    d = Path(root) / what / f"rank{rank}"
    if name is not None:
        d = d / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over every byte of ``storage`` (on its device)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class Stager:
    """The host staging buffer of ``chunk_mb`` MiB that every byte passes through on its way to or from a file;
    ``write`` casts to the file's dtype in it, ``read`` casts back."""

    def __init__(self, chunk_mb: int, pin: bool):
        self.nbytes, self.pin = chunk_mb << 20, pin
        self._buf: torch.Tensor | None = None

    def _host(self) -> torch.Tensor:
        if self._buf is None:
            self._buf = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=self.pin)
        return self._buf

    def release(self) -> None:
        """Drop the buffer (host memory while nothing moves: none)."""
        self._buf = None

    def write(self, f, flat: torch.Tensor, dtype: torch.dtype) -> int:
        """``flat`` (1-D) into the open file ``f`` as ``dtype``, a chunk at a time; -> bytes written."""
        buf, size = self._host(), dtype.itemsize
        step = self.nbytes // size
        for pos in range(0, flat.numel(), step):
            n = min(step, flat.numel() - pos)
            buf[: n * size].view(dtype).copy_(flat[pos : pos + n])
            f.write(memoryview(buf[: n * size].numpy()))
        return flat.numel() * size

    def read(self, f, flat: torch.Tensor, dtype: torch.dtype) -> int:
        """``flat`` (1-D, allocated) from the open file ``f`` holding it as ``dtype``; -> bytes read."""
        buf, size = self._host(), dtype.itemsize
        step = self.nbytes // size
        for pos in range(0, flat.numel(), step):
            n = min(step, flat.numel() - pos)
            view = memoryview(buf[: n * size].numpy())
            got = 0
            while got < len(view):
                k = f.readinto(view[got:])
                if not k:
                    raise EOFError(f"{f.name}: ended after {pos * size + got} bytes, {flat.numel() * size} expected")
                got += k
            flat[pos : pos + n].copy_(buf[: n * size].view(dtype))
        return flat.numel() * size


def write_file(path: Path, tensors: list[torch.Tensor], dtype: torch.dtype | None, stager: Stager) -> int:
    """``tensors`` one after another into ``path`` (each as ``dtype``, None: its own), via <path>.part renamed when
    complete; -> bytes written."""
    part = path.with_name(path.name + ".part")
    with open(part, "wb") as f:
        n = sum(stager.write(f, t.view(-1), dtype or t.dtype) for t in tensors)
    os.replace(part, path)
    return n


def read_file(path: Path, tensors: list[torch.Tensor], dtype: torch.dtype | None, stager: Stager) -> int:
    """The inverse of ``write_file``: ``tensors`` (allocated) filled from ``path``; -> bytes read."""
    with open(path, "rb", buffering=0) as f:
        return sum(stager.read(f, t.view(-1), dtype or t.dtype) for t in tensors)


class HostPark:
    """offload_train_target cpu: a storage's bytes in a host copy (pinned for a GPU)."""

    def __init__(self, pin: bool):
        self.pin = pin

    def put(self, index: int, storage: torch.UntypedStorage) -> torch.UntypedStorage:
        host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=self.pin).untyped_storage()
        host.copy_(storage)
        return host

    def take(self, host: torch.UntypedStorage, storage: torch.UntypedStorage) -> None:
        storage.copy_(host)

    def done(self) -> None:
        """After a whole offload or onload (nothing to release)."""

    @staticmethod
    def host_bytes(host) -> int:
        return host.nbytes()

    @staticmethod
    def disk_bytes(host) -> int:
        return 0


class DiskPark:
    """offload_train_target disk: a storage's bytes in a file of its own, <dir>/<index>.bin, under
    <root>/train_state/rank<r>; the file is removed once its bytes are back. No host memory is held while parked."""

    def __init__(self, root: Path, chunk_mb: int, pin: bool):
        self.dir = process_dir(root, "train_state")
        self.stager = Stager(chunk_mb, pin)

    def put(self, index: int, storage: torch.UntypedStorage) -> tuple[Path, int]:
        path = self.dir / f"{index}.bin"
        write_file(path, [byte_view(storage)], None, self.stager)
        return path, storage.nbytes()

    def take(self, handle: tuple[Path, int], storage: torch.UntypedStorage) -> None:
        path, _ = handle
        read_file(path, [byte_view(storage)], None, self.stager)
        path.unlink()

    def done(self) -> None:
        self.stager.release()

    @staticmethod
    def host_bytes(handle) -> int:
        return 0

    @staticmethod
    def disk_bytes(handle) -> int:
        return handle[1]


# offload_train_target -> its park, built from the config and whether the device is a GPU (pinned staging)
PARKS = {
    "cpu": lambda cfg, pin: HostPark(pin),
    "disk": lambda cfg, pin: DiskPark(cfg.offload_disk_dir, cfg.parallel.offload_train_disk_chunk_mb, pin),
}


def park_of(cfg, device: torch.device):
    """The park of ``cfg``'s offload_train_target for state on ``device``."""
    return PARKS[cfg.parallel.offload_train_target](cfg, device.type == "cuda")
