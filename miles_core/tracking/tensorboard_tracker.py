"""TensorBoard mirror (tensorboardX event files): one subdirectory per MLflow run (or tb_experiment_name) under
tensorboard_dir[/tb_project_name], each scalar at its axis step. Its resume marks are read back from the event files already there, so a
step the writer flushed before a crash is not written twice, and one it lost is written again."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator

from .catalog import AXES
from .keys import sanitize_key


class TensorboardMirror:
    name = "tensorboard"

    def __init__(self, logdir: Path):
        from tensorboardX import SummaryWriter

        self.logdir = logdir
        self.link = str(logdir)
        self.marks = {axis: max(step for step, _ in points) for axis, points in read_scalars(logdir, AXES).items()}
        self.writer = SummaryWriter(logdir=str(logdir), flush_secs=30)

    @classmethod
    def open(cls, spec) -> "TensorboardMirror":
        t = spec.tracking
        root = Path(t.tensorboard_dir).absolute() if t.tensorboard_dir else spec.run_dir / "tensorboard"
        return cls(root / (t.tb_project_name or "") / (t.tb_experiment_name or spec.mlflow_run_id))

    def log(self, metrics: dict[str, float], axis: str, step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(sanitize_key(key), float(value), global_step=int(step))

    log_extra = log

    def flush(self) -> None:
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


def read_scalars(logdir: Path, tags: tuple[str, ...] | None = None) -> dict[str, list[tuple[int, float]]]:
    """tag -> (step, value) of its scalar events, over every event file in ``logdir`` (in file order)."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")) if logdir.is_dir() else []:
        for record in _records(path):
            event = Event.FromString(record)
            for value in event.summary.value:
                if tags is None or value.tag in tags:
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def _records(path: Path) -> Iterator[bytes]:
    """TFRecord framing: u64 length, u32 crc of the length, data, u32 crc of the data. A torn tail
    (a writer killed mid-record) ends the file."""
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        end = pos + 12 + length + 4
        if end > len(data):
            return
        yield data[pos + 12 : pos + 12 + length]
        pos = end
