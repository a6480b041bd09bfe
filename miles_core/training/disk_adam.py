"""stream_optimizer_state_to_disk: AdamW's moments (exp_avg, exp_avg_sq) live in files between optimizer steps and
are streamed through the device one bucket of parameters at a time around the step (the torch trainer).

Buckets: the optimizer's parameters in order, cut so that a bucket's fp32 moments (8 bytes a parameter element)
fit offload_train_disk_chunk_mb MiB (a parameter larger than that is a bucket alone). A step, per bucket: the
bucket's moments are read back from its file (<offload_train_disk_dir>/optimizer_state/rank<r>/<actor|critic>/
<bucket>.bin, cast from stream_optimizer_state_moment_dtype to fp32), the torch optimizer steps the bucket's
parameters only (the other parameters' gradients are hidden for the call: torch's AdamW skips a parameter without
a gradient, and every one of its updates is elementwise, so a parameter's update is the one a step of all of them
gives), then the moments are written back in the moment dtype and their storages resized to 0 bytes. So the
device holds one bucket's moments at a time, the host one staging chunk (disk.py), and the optimizer object, its
state dict keys, step counts and learning rates stay torch's own.

fp32 writes the moments' exact bits: the run equals one without streaming, bit for bit. bf16 / fp16 / fp8e4m3 /
fp8e5m2 round the moments on every write (a serialization format, not the step's precision: the step computes in
fp32, as the reference's); fp16 and the fp8 formats have no per-block scaling, so a small exp_avg_sq can flush to
0 (the reference does not recommend fp8). The step count and the parameters (the torch trainer's fp32 weights,
which the forward reads) stay on the device.

Whatever reads the whole optimizer state (a checkpoint save, a restore's load_state_dict) runs inside
``resident()``: every bucket read back first, written and freed again after (a restore's new state included).

The reference's counterpart streams megatron's distributed optimizer's fp32 main weights and moments per bucket
(miles_plugins/optimizers/nvme_stream.py 152-206 buckets, 349-366 step; dtypes 45-51); the torch trainer has no
main weights apart from its parameters, so the moments are what is streamed here.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from .disk import MOMENT_DTYPES, Stager, process_dir, read_file, write_file

MOMENTS = ("exp_avg", "exp_avg_sq")


class ResidentMoments:
    """The default: the moments stay in the optimizer's state; ``step`` is the optimizer's own."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer

    def step(self) -> None:
        self.optimizer.step()

    def resident(self):
        return contextlib.nullcontext()


class DiskMoments:
    """The moments of ``optimizer`` in files under <root>/optimizer_state/rank<r>/<name> (see the module docstring)."""

    def __init__(self, optimizer: torch.optim.Optimizer, root: Path, name: str, chunk_mb: int, moment_dtype: str,
                 pin: bool):
        self.optimizer, self.dtype = optimizer, MOMENT_DTYPES[moment_dtype]
        self.dir = process_dir(root, "optimizer_state", name)
        self.stager = Stager(chunk_mb, pin)
        self.buckets = _buckets([p for g in optimizer.param_groups for p in g["params"]], chunk_mb << 20)
        self.on_disk: dict[int, list[torch.Tensor]] = {}  # bucket -> its parameters whose moments are in its file

    @torch.no_grad()
    def step(self) -> None:
        """One optimizer step, a bucket at a time (grads as the caller left them, afterwards too)."""
        params = [p for bucket in self.buckets for p in bucket]
        grads = [p.grad for p in params]
        try:
            for i, bucket in enumerate(self.buckets):
                mine = {id(p) for p in bucket}
                for p, g in zip(params, grads):
                    p.grad = g if id(p) in mine else None
                self._fetch(i)
                self.optimizer.step()
                self._flush(i)
        finally:
            for p, g in zip(params, grads):
                p.grad = g
            self.stager.release()

    @contextlib.contextmanager
    def resident(self):
        """Every moment back in the optimizer's state inside; whatever state there is then (a restore's) is written
        out and freed on the way out."""
        for i in list(self.on_disk):
            self._fetch(i)
        try:
            yield
        finally:
            for i in range(len(self.buckets)):
                self._flush(i)
            self.stager.release()

    def disk_bytes(self) -> int:
        """Bytes of the moments in files now."""
        return sum(f.stat().st_size for f in self.dir.glob("*.bin"))

    def _path(self, i: int) -> Path:
        return self.dir / f"{i}.bin"

    def _moments(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.optimizer.state[p][k] for p in params for k in MOMENTS]

    def _fetch(self, i: int) -> None:
        params = self.on_disk.pop(i, None)
        if params is None:
            return
        moments = self._moments(params)
        for t in moments:
            t.untyped_storage().resize_(t.numel() * t.element_size())
        read_file(self._path(i), moments, self.dtype, self.stager)

    def _flush(self, i: int) -> None:
        if i in self.on_disk:
            return  # already there (resident() exits over buckets a step left on disk)
        state = self.optimizer.state
        params = [p for p in self.buckets[i] if all(k in state.get(p, {}) for k in MOMENTS)]
        if not params:
            return
        write_file(self._path(i), self._moments(params), self.dtype, self.stager)
        for p in params:
            for k in MOMENTS:
                t = state[p][k]
                if not t.untyped_storage().resizable():  # loaded from a mapped checkpoint file: a storage of our own
                    t = state[p][k] = torch.empty_like(t)
                t.untyped_storage().resize_(0)
        self.on_disk[i] = params


def _buckets(params: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """``params`` in order, cut where a bucket's fp32 moments (8 bytes an element) would pass ``limit`` bytes."""
    buckets, size = [[]], 0
    for p in params:
        nbytes = 2 * 4 * p.numel()
        if buckets[-1] and size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return [b for b in buckets if b]


def moments_of(cfg, optimizer: torch.optim.Optimizer, name: str, device: torch.device):
    """stream_optimizer_state_to_disk: ``optimizer``'s moments in files (DiskMoments); else ResidentMoments."""
    p = cfg.parallel
    if not p.stream_optimizer_state_to_disk:
        return ResidentMoments(optimizer)
    return DiskMoments(optimizer, cfg.offload_disk_dir, name, p.offload_train_disk_chunk_mb,
                       p.stream_optimizer_state_moment_dtype, device.type == "cuda")
