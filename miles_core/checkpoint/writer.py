"""CheckpointWriter: `save_checkpoint` calls made now, or (async_save) in a background thread.

With ``background`` a write first snapshots what it saves (every module's and optimizer's state_dict copied to
host memory, and the RNG state, at the moment of the call: training goes on meanwhile and changes the live
tensors in place), then one worker thread runs the `save_checkpoint` calls in order on the snapshot, with the
same atomic protocol (temp dir, `.complete` manifest, rename, `latest` last), so a reader still never sees a
half-written checkpoint. One write is in flight at most: the next one, and ``wait``, first wait for it and
re-raise its error. The reference's counterpart is Megatron-LM's async save (`--async-save`,
megatron.training.async_utils, finalized by maybe_finalize_async_save before the next save and at the end).
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from miles_core.checkpoint.rng import capture_rng_state
from miles_core.checkpoint.save import save_checkpoint


def _host_copy(obj):
    """A state_dict (nested dicts and lists of tensors and plain values) with every tensor copied to host memory."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _host_copy(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_host_copy(v) for v in obj)
    return copy.deepcopy(obj)


class Snapshot:
    """A module's or optimizer's state_dict as it is now (host copies), and the module's HF config if any: what
    `save_checkpoint` reads of a part."""

    def __init__(self, part):
        self._state = _host_copy(part.state_dict())
        self.config = getattr(part, "config", None)

    def state_dict(self) -> dict:
        return self._state


def _frozen(kwargs: dict) -> dict:
    parts = {k: (Snapshot(v) if v is not None else None) for k, v in kwargs.items() if k in ("model", "optimizer")}
    for name in ("extra_tensors", "extra_optimizers"):
        if kwargs.get(name):
            parts[name] = {n: Snapshot(m) for n, m in kwargs[name].items()}
    return {**kwargs, **parts}


@dataclass
class Write:
    """One `save_checkpoint(save_dir, rollout_id, **kwargs)` call."""

    save_dir: Path
    rollout_id: int
    kwargs: dict = field(default_factory=dict)


class CheckpointWriter:
    def __init__(self, background: bool):
        self.background = background
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="miles-async-save") if background else None
        self._pending: Future | None = None

    @property
    def pending(self) -> bool:
        """A background write not finished yet."""
        return self._pending is not None and not self._pending.done()

    def write(self, writes: list[Write]) -> None:
        """The saves, in order: now, or (background) snapshotted now and written by the worker thread."""
        self.wait()
        if not self.background:
            for w in writes:
                save_checkpoint(w.save_dir, w.rollout_id, **w.kwargs)
            return
        rng = capture_rng_state()
        frozen = [Write(w.save_dir, w.rollout_id, {**_frozen(w.kwargs), "rng_state": rng}) for w in writes]
        self._pending = self._pool.submit(lambda: [save_checkpoint(w.save_dir, w.rollout_id, **w.kwargs) for w in frozen])

    def wait(self) -> None:
        """Block until the background write is on disk (complete, ``latest`` moved); its error, if any, raised here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
