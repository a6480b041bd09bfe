"""The run's typed events (save_debug_event_data), as the reference's event logger (miles/utils/audit_utils/event_logger/:
logger.py, models.py, checkpoint.py): one JSON-lines file per process identity in the event dir, one event a line.

    main.jsonl               the driver: rollout_generated, train_step_end, weight_sync, checkpoint_saved,
                             checkpoint_restored, metric, inference_engine_weight_checksum (the engines' digests after
                             a sync, asked by the driver as the reference's train group asks its rollout manager)
    actor_cell0_rank0.jsonl  the trainer: train_engine_local_weight_checksum (a digest of each tensor it sent at a sync,
                             computed on train rank 0, written by the process that drives the sync)

A digest is ``weights.disk.tensor_sha256`` (check_lora_weight_equal's): sha256 of the tensor's bytes in its dtype.
Events are appended with the file opened per write, so a restore may replace the dir between two events
(logger.py:63-67). ``snapshot`` copies the dir to ``<save>/debug_events/<rollout_id>/`` after a checkpoint save
(the reference: ``<save>/iter_<N>/debug_events``, checkpoint.py:15-28); ``restore`` puts the snapshot of the restored
checkpoint back, the dir it replaces moved aside to ``.trash_<time>_<id>`` (checkpoint.py:31-49).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

log = logging.getLogger(__name__)
SNAPSHOTS = "debug_events"  # <save>/debug_events/<rollout_id>/ (checkpoint/layout.py skips it in a scan)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProcessIdentity(_Strict):
    """Who wrote an event (the reference's process_identity.py): the driver ("main") or a trainer rank ("actor")."""

    component: Literal["main", "actor"] = "main"
    cell_index: int = 0
    rank_within_cell: int = 0

    def to_name(self) -> str:
        return "main" if self.component == "main" else f"{self.component}_cell{self.cell_index}_rank{self.rank_within_cell}"


MAIN, TRAINER = ProcessIdentity(), ProcessIdentity(component="actor")


class EventBase(_Strict):
    timestamp: datetime
    source: ProcessIdentity


class RolloutGeneratedEvent(EventBase):
    type: Literal["rollout_generated"] = "rollout_generated"
    rollout_id: int
    weight_version: int
    num_samples: int


class TrainStepEndEvent(EventBase):
    type: Literal["train_step_end"] = "train_step_end"
    rollout_id: int
    num_steps: int


class WeightSyncEvent(EventBase):
    type: Literal["weight_sync"] = "weight_sync"
    rollout_id: int | None  # the last rollout trained on; None for the sync before rollout 0
    weight_version: int


class CheckpointSavedEvent(EventBase):
    type: Literal["checkpoint_saved"] = "checkpoint_saved"
    rollout_id: int
    save_dir: str


class CheckpointRestoredEvent(EventBase):
    type: Literal["checkpoint_restored"] = "checkpoint_restored"
    rollout_id: int
    load_dir: str
    weight_version: int


class MetricEvent(EventBase):
    type: Literal["metric"] = "metric"
    rollout_id: int | None = None
    metrics: dict[str, Any]


class TrainEngineLocalWeightChecksumEvent(EventBase):
    """The reference's event of the same type; here the state is what the trainer sent at sync ``weight_version``."""

    type: Literal["train_engine_local_weight_checksum"] = "train_engine_local_weight_checksum"
    rollout_id: int | None
    weight_version: int
    param_hashes: dict[str, str]  # {HF tensor name: sha256 hex}


class InferenceEngineWeightChecksumEvent(EventBase):
    type: Literal["inference_engine_weight_checksum"] = "inference_engine_weight_checksum"
    rollout_id: int | None
    weight_version: int
    engine_checksums: list[dict[str, str]]  # one {tensor name: sha256 hex} per engine


Event = Annotated[Union[RolloutGeneratedEvent, TrainStepEndEvent, WeightSyncEvent, CheckpointSavedEvent,
                        CheckpointRestoredEvent, MetricEvent, TrainEngineLocalWeightChecksumEvent,
                        InferenceEngineWeightChecksumEvent], Field(discriminator="type")]
_ADAPTER: TypeAdapter = TypeAdapter(Event)


class EventLog:
    """Appends events under ``log_dir``, one file per source (``<source>.jsonl``); thread-safe."""

    def __init__(self, log_dir: str | Path):
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def log(self, event_cls: type[EventBase], source: ProcessIdentity = MAIN, **fields) -> EventBase:
        event = event_cls(timestamp=datetime.now(timezone.utc), source=source, **fields)
        line = event.model_dump_json() + "\n"
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True)  # a restore may have replaced the dir
            with (self.dir / f"{source.to_name()}.jsonl").open("a", encoding="utf-8") as f:
                f.write(line)
        return event


def read_events(log_dir: str | Path) -> list[EventBase]:
    """Every event of every ``*.jsonl`` under ``log_dir`` (file by file, in name order). A line that does not parse
    raises ValueError naming the file and line (the reference logs a warning and skips it)."""
    events = []
    for path in sorted(Path(log_dir).glob("**/*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    events.append(_ADAPTER.validate_json(line))
                except ValueError as e:
                    raise ValueError(f"event file {path}:{n} does not parse as an event: {e}") from None
    return events


def snapshot_dir(save_dir: str | Path, rollout_id: int) -> Path:
    return Path(save_dir) / SNAPSHOTS / str(rollout_id)


def snapshot(event_dir: str | Path, save_dir: str | Path, rollout_id: int) -> Path | None:
    """Copy the event dir to <save>/debug_events/<rollout_id>/ (atomic: copied beside it, then renamed); -> the copy."""
    src, dst = Path(event_dir), snapshot_dir(save_dir, rollout_id)
    if not src.is_dir():
        return None
    tmp = dst.with_name(f".tmp-{rollout_id}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
    return dst


def prune_snapshots(save_dir: str | Path, keep: set[int]) -> None:
    """Drop the snapshots of checkpoints retention removed (their rollout ids not in ``keep``)."""
    root = Path(save_dir) / SNAPSHOTS
    for entry in root.iterdir() if root.is_dir() else ():
        if entry.name.isdigit() and int(entry.name) not in keep:
            shutil.rmtree(entry, ignore_errors=True)


def restore(event_dir: str | Path, load_dir: str | Path, rollout_id: int) -> bool:
    """The snapshot of checkpoint ``rollout_id`` back as the event dir (the current one moved aside); False when the
    checkpoint has none (saved without save_debug_event_data)."""
    src, dst = snapshot_dir(load_dir, rollout_id), Path(event_dir)
    if not src.is_dir():
        return False
    if dst.exists():
        trash = dst.parent / f".trash_{time.strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:8]}"
        dst.rename(trash)
        log.info("event dir %s moved aside to %s before the restore", dst, trash)
    shutil.copytree(src, dst)
    log.info("event dir %s restored from %s", dst, src)
    return True
