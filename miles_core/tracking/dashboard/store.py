"""The dashboard's files: append-only JSONL streams under ``<run_dir>/dashboard/``, one record type per stream.

    meta.json            {run_name, mlflow_run_id, start_ts, device_sampler, scrape_mode, metric_names, intervals}
    metrics.jsonl        MetricsRecord: one row the trackers logged (rollout/step, train/step, eval/step)
    gpu_util.jsonl       GpuSample: one GPU at one tick (NVML or torch.cuda)
    host.jsonl           HostSample: the host at one tick (a run with no GPU)
    engine_series.jsonl  EngineSample: one SGLang metric of one engine at one scrape

The collector's threads ``append`` (thread-safe, buffered in memory) and the flush thread writes the buffers out;
a stream's buffer is bounded (``MAX_BUFFERED``): past it the oldest records are dropped and the next flush logs how
many (a disk that keeps failing must not grow the driver's memory). The reference's store (miles/dashboard/store.py)
partitions its high-rate streams by hour and reads them with polars; ours keeps one file per stream.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

log = logging.getLogger(__name__)

META = "meta.json"


@dataclass(frozen=True)
class MetricsRecord:
    stream: ClassVar[str] = "metrics"
    ts: float
    axis: str  # rollout/step, train/step or eval/step
    step: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class GpuSample:
    stream: ClassVar[str] = "gpu_util"
    ts: float
    node: str
    gpu: int
    source: str  # nvml | torch.cuda
    mem_mb: int  # device memory in use (every process's)
    util: int | None  # percent busy over NVML's last sample period; None without NVML
    power_w: int | None  # None without NVML


@dataclass(frozen=True)
class HostSample:
    stream: ClassVar[str] = "host"
    ts: float
    node: str
    cpu_util: float  # percent of all CPUs since the previous sample (psutil.cpu_percent)
    mem_mb: int  # host memory in use (psutil.virtual_memory().used)
    rss_mb: int  # this process's resident memory


@dataclass(frozen=True)
class EngineSample:
    stream: ClassVar[str] = "engine_series"
    ts: float
    addr: str  # the engine's base URL
    metric: str  # sglang_<name> (SGLang's sglang:<name> with ':' as '_', as the reference)
    labels: dict[str, str]
    value: float


STREAMS = tuple(r.stream for r in (MetricsRecord, GpuSample, HostSample, EngineSample))


class DashboardStore:
    MAX_BUFFERED: ClassVar[int] = 200_000  # records per stream held in memory between flushes

    def __init__(self, root: Path):
        self.root = Path(root)
        self._buffers: dict[str, list[dict]] = {s: [] for s in STREAMS}
        self._dropped = 0
        self._lock = threading.Lock()
        self.written: dict[str, int] = dict.fromkeys(STREAMS, 0)  # records flushed to each file by this store

    def write_meta(self, meta: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / META).write_text(json.dumps(meta, indent=1))

    def append(self, record) -> None:
        with self._lock:
            buf = self._buffers[record.stream]
            if len(buf) >= self.MAX_BUFFERED:
                drop = max(1, len(buf) // 10)
                del buf[:drop]
                self._dropped += drop
            buf.append(asdict(record))

    def flush(self) -> None:
        """Append every buffered record to its stream's file; a failed write keeps them buffered and is logged."""
        with self._lock:
            if self._dropped:
                log.error("dashboard store dropped %d records since the last flush (buffers full: is %s writable?)",
                          self._dropped, self.root)
                self._dropped = 0
            self.root.mkdir(parents=True, exist_ok=True)
            for stream, buf in self._buffers.items():
                if not buf:
                    continue
                try:
                    with open(self.root / f"{stream}.jsonl", "a") as f:
                        f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in buf))
                except OSError:
                    log.exception("dashboard flush of %s to %s failed; its records stay buffered", stream, self.root)
                    continue
                self.written[stream] += len(buf)
                buf.clear()


def read_meta(root: Path) -> dict[str, Any]:
    path = Path(root) / META
    return json.loads(path.read_text()) if path.is_file() else {}


def read_stream(root: Path, stream: str, since: float | None = None, limit: int | None = None) -> list[dict]:
    """The complete records of one stream (a line being appended is skipped), those with ts > since; the last ``limit``."""
    if stream not in STREAMS:
        raise KeyError(f"no dashboard stream {stream!r}; streams: {', '.join(STREAMS)}")
    path = Path(root) / f"{stream}.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines(keepends=True) if line.endswith("\n")]
    if since is not None:
        rows = [r for r in rows if r["ts"] > since]
    return rows[-limit:] if limit else rows
