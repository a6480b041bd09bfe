"""The dashboard collector, a tracker mirror (tracking/fanout.py MIRRORS["use_miles_dashboard"]): opened with the run's
trackers, it writes ``<run_dir>/dashboard/`` (store.py) until the run's trackers close.

    log / log_extra    every row the fan-out logs (rollout/step, train/step, eval/step) -> metrics.jsonl
    sampler thread     every dashboard_gpu_sample_interval s: samplers.py (nvml | torch.cuda | host)
    scraper thread     every dashboard_sglang_scrape_interval s: scraper.py over MirrorSpec.engine_urls()
    flush thread       every dashboard_flush_interval s: the buffers to the JSONL files; with
                       dashboard_forward_prometheus the latest sampled values as gauges on the Prometheus mirror
    close              stop the threads, a last sample, scrape and flush, then the directory to MLflow under dashboard/

As the reference's DashboardCollector (miles/dashboard/collector.py), minus its Ray actors: one process, threads.
Forwarded gauge keys are the reference's (_prometheus_snapshot): dashboard/gpu_<node>_<gpu>_util and _mem_mb,
dashboard/engine_<addr>_running_reqs, and ours for a CPU run: dashboard/host_cpu_util, dashboard/host_mem_mb.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Callable

from .samplers import Ticker, open_sampler
from .scraper import DEFAULT_METRICS, EngineScraper
from .store import DashboardStore, EngineSample, GpuSample, HostSample, MetricsRecord

log = logging.getLogger(__name__)
DIRNAME = "dashboard"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", text.removeprefix("http://").removeprefix("https://"))


class DashboardMirror:
    name = "dashboard"

    def __init__(self, spec, forward: Callable[[dict[str, float]], None] | None = None, sampler=None):
        t = spec.tracking
        self.root = spec.run_dir / DIRNAME
        self.link = str(self.root)
        self.marks: dict[str, int] = {}  # every row is an event: a resumed run appends to the same files
        self.store = DashboardStore(self.root)
        self.sampler = sampler or open_sampler()
        names = t.dashboard_metric_names or DEFAULT_METRICS
        self.scraper = EngineScraper(spec.engine_urls, names)
        self.log_artifacts = spec.log_artifacts
        self.forward = forward  # dashboard_forward_prometheus: the Prometheus mirror's set_gauges
        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        self.store.write_meta({
            "run_name": spec.run_name, "mlflow_run_id": spec.mlflow_run_id, "start_ts": time.time(),
            "device_sampler": self.sampler.source, "scrape_mode": "direct",  # auto resolves to it (router is refused at load)
            "configured_scrape_mode": t.dashboard_sglang_scrape_mode, "metric_names": sorted(names),
            "intervals": {"flush": t.dashboard_flush_interval, "gpu_sample": t.dashboard_gpu_sample_interval,
                          "sglang_scrape": t.dashboard_sglang_scrape_interval},
            "forward_prometheus": t.dashboard_forward_prometheus,
        })
        self.tickers = [Ticker("sampler", t.dashboard_gpu_sample_interval, self.sample_once).start(),
                        Ticker("scraper", t.dashboard_sglang_scrape_interval, self.scrape_once).start(),
                        Ticker("flush", t.dashboard_flush_interval, self.flush_once).start()]
        self._closed = False

    # ---- producers ------------------------------------------------------------------------------
    def log(self, metrics: dict[str, float], axis: str, step: int) -> None:
        self.store.append(MetricsRecord(ts=time.time(), axis=axis, step=step, metrics={k: float(v) for k, v in metrics.items()}))

    log_extra = log

    def sample_once(self) -> None:
        for s in self.sampler.sample(time.time()):
            self.store.append(s)
            self._remember(s)

    def scrape_once(self) -> None:
        for s in self.scraper.scrape(time.time()):
            self.store.append(s)
            self._remember(s)

    def _remember(self, s) -> None:
        if isinstance(s, GpuSample):
            latest = {f"dashboard/gpu_{_safe(s.node)}_{s.gpu}_mem_mb": float(s.mem_mb)}
            if s.util is not None:
                latest[f"dashboard/gpu_{_safe(s.node)}_{s.gpu}_util"] = float(s.util)
        elif isinstance(s, HostSample):
            latest = {"dashboard/host_cpu_util": s.cpu_util, "dashboard/host_mem_mb": float(s.mem_mb)}
        elif isinstance(s, EngineSample) and s.metric == "sglang_num_running_reqs":
            latest = {f"dashboard/engine_{_safe(s.addr)}_running_reqs": s.value}
        else:
            return
        with self._lock:
            self._latest |= latest

    # ---- flushing -------------------------------------------------------------------------------
    def flush_once(self) -> None:
        self.store.flush()
        if self.forward is not None:
            with self._lock:
                latest = dict(self._latest)
            if latest:
                self.forward(latest)

    def flush(self) -> None:
        """Before a checkpoint: what was logged so far is in the files."""
        self.store.flush()

    def close(self, status: str) -> None:
        if self._closed:
            return
        self._closed = True
        for ticker in self.tickers:
            ticker.stop()
        self.sample_once()  # the state at the end, so even a run shorter than one interval has a sample
        self.flush_once()
        self.sampler.close()
        if self.log_artifacts is not None:
            self.log_artifacts(str(self.root), DIRNAME)
