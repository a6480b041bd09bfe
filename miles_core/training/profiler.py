"""Training traces (torch.profiler) and CUDA memory snapshots: the reference's TrainProfiler
(miles/utils/profile_utils.py), switched by the Megatron-LM flags it reads (use_pytorch_profiler,
record_memory_history; config/misc.py, docs/performance.md "Profiling").

use_pytorch_profiler traces the profile_target parts of training, each with a profiler of its own whose steps
[profile_step_start, profile_step_end) are recorded (torch.profiler.schedule: wait max(start - 1, 0), warmup 1 when
start > 0, active end - start, once):

    train_overall    one profiler from the trainer's build on; a step per train_rollout call of this process
                     (counted from 0: a resumed run counts from its first rollout trained), so a step spans the
                     rollout's generation and its training
    train_actor      one profiler per optimizer step of the actor (the torch engine's backward): a step per
                     micro-batch, forward + backward
    train_log_probs  one profiler per forward-only pass of the torch engine (old policy, reference): a step per
                     micro-batch

Each recorded window is written when it closes (a pass that ends inside its window: when the pass ends), by
torch's tensorboard_trace_handler, to ``<tensorboard_root>/<target>_rank_<rank>.<ns>.pt.trace.json.gz``: a Chrome
trace (chrome://tracing, Perfetto; TensorBoard's profiler plugin). The flow logs the new ones to MLflow under
profile/ after each rollout (``profile_files``). A run that ends inside train_overall's window writes no trace for
it (as the reference). Profilers do not nest (one inside another crashes the process): the config rules refuse
train_overall with the other two.

record_memory_history (device cuda, memory_recorder torch): the CUDA caching allocator records its history
(torch.cuda.memory._record_memory_history, every stack) from the trainer's build; after the train of rollout
memory_snapshot_num_steps - 1 the snapshot is dumped (torch.cuda.memory._dump_snapshot) to
``<memory_snapshot_root>/memory_snapshot_time<t>_rank<rank>_<memory_snapshot_path>`` and recording stops; a CUDA
out-of-memory error dumps it too (an allocator OOM observer). Read it at pytorch.org/memory_viz.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from miles_core.config import TrainConfig

log = logging.getLogger(__name__)

TARGETS = ("train_overall", "train_actor", "train_log_probs")
TRACE_SUFFIX = ".pt.trace.json.gz"  # torch.profiler.tensorboard_trace_handler's, gzipped
SNAPSHOT_PREFIX = "memory_snapshot_time"
_END = object()


def this_rank() -> int:
    """This process's rank in the train group (0 without a process group: the local runtime)."""
    return torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0


def profile_files(cfg: TrainConfig) -> list[Path]:
    """The traces and memory snapshots this run's profiling has written so far (empty when it is off)."""
    m = cfg.misc
    found: list[Path] = []
    if m.use_pytorch_profiler and cfg.tensorboard_root.is_dir():
        found += [p for p in cfg.tensorboard_root.iterdir() if p.name.endswith(TRACE_SUFFIX) and p.name.startswith(TARGETS)]
    if m.record_memory_history and cfg.memory_snapshot_root.is_dir():
        found += [p for p in cfg.memory_snapshot_root.iterdir() if p.name.startswith(SNAPSHOT_PREFIX)]
    return sorted(found)


class TrainProfiler:
    """What one trainer process profiles (module docstring); with both switches off every member does nothing.

    started()         the trainer is built: train_overall's profiler starts
    step(rollout_id)  a rollout was trained: train_overall's next step; the memory snapshot when it is due
    loop(target, it)  iterate ``it`` (a pass's micro-batches) under ``target``'s profiler, a step per item
    """

    def __init__(self, *, targets: frozenset[str] = frozenset(), window: tuple[int, int] = (0, 1), trace_dir: Path | None = None,
                 rank: int = 0, memory: "CudaMemoryHistory | None" = None, snapshot_after: int | None = None):
        self.targets, self.window, self.trace_dir, self.rank = targets, window, trace_dir, rank
        self._overall: torch.profiler.profile | None = None
        self._memory, self._snapshot_after = memory, snapshot_after
        if memory is not None:
            memory.start()

    @classmethod
    def of(cls, cfg: TrainConfig, rank: int | None = None) -> "TrainProfiler":
        """The config's profiling (nothing when use_pytorch_profiler and record_memory_history are off); the memory
        history starts recording here."""
        m = cfg.misc
        rank = this_rank() if rank is None else rank
        memory = None
        if m.record_memory_history and "train_overall" in m.profile_target:
            name = f"{SNAPSHOT_PREFIX}{time.time()}_rank{rank}_{m.memory_snapshot_path}"
            memory = MEMORY_RECORDERS[m.memory_recorder](cfg.memory_snapshot_root / name)
        return cls(targets=frozenset(m.profile_target) if m.use_pytorch_profiler else frozenset(),
                   window=(m.profile_step_start, m.profile_step_end), trace_dir=cfg.tensorboard_root, rank=rank,
                   memory=memory, snapshot_after=m.memory_snapshot_num_steps)

    def started(self) -> None:
        if "train_overall" in self.targets and self._overall is None:
            self._overall = self._profiler("train_overall")
            self._overall.start()

    def step(self, rollout_id: int) -> None:
        if self._overall is not None:
            self._overall.step()
            if self._overall.step_num >= self.window[1]:  # its one window is written: nothing more to record
                self._overall.stop()
                self._overall = None
        if self._memory is not None and self._snapshot_after is not None and rollout_id == self._snapshot_after - 1:
            self._memory.dump_and_stop()
            self._memory = None

    def loop(self, target: str, items: Iterable) -> Iterator:
        """``items`` one by one; under a fresh profiler of ``target`` when it is profiled (a step per item; its window
        written when it closes, or when the items end inside it)."""
        if target not in self.targets:
            yield from items
            return
        prof, it = self._profiler(target), iter(items)
        prof.start()
        try:
            item = next(it, _END)
            while item is not _END:
                yield item
                item = next(it, _END)
                if item is not _END:  # no step after the last item: a window cut by the end holds only items run
                    prof.step()
        finally:
            prof.stop()

    def _profiler(self, target: str) -> torch.profiler.profile:
        start, end = self.window
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        return torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=max(start - 1, 0), warmup=1 if start > 0 else 0, active=end - start, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(self.trace_dir), worker_name=f"{target}_rank_{self.rank}",
                                                                    use_gzip=True),
            record_shapes=True, with_stack=True, profile_memory=True, with_flops=True,
        )


class CudaMemoryHistory:
    """memory_recorder torch: the CUDA caching allocator's history, dumped to ``path`` (and at an OOM)."""

    def __init__(self, path: Path):
        if not torch.cuda.is_available():
            raise ValueError("record_memory_history: torch sees no CUDA device, and memory_recorder torch records the CUDA "
                             "caching allocator's history; use device cuda, or drop record_memory_history")
        self.path = path

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="all")
        torch._C._cuda_attach_out_of_memory_observer(self._on_oom)

    def _on_oom(self, device, alloc, device_alloc, device_free) -> None:
        log.error("CUDA out of memory on device %s (allocating %d bytes, %d allocated, %d free): memory snapshot to %s",
                  device, alloc, device_alloc, device_free, self.path)
        torch.cuda.memory._dump_snapshot(str(self.path))

    def dump_and_stop(self) -> None:
        log.info("memory snapshot to %s", self.path)
        torch.cuda.memory._dump_snapshot(str(self.path))
        torch.cuda.memory._record_memory_history(enabled=None)


MEMORY_RECORDERS = {"torch": CudaMemoryHistory}  # memory_recorder -> recorder (memray: refused at load, rules_profile.py)
